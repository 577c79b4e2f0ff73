"""What the GPU check's two child runners share (``gpu_parts.py``: the plain-loop parts;
``gpu_adapters.py``: the adapters): spawning a part in a child process and writing its result,
the expandable-segments environment, the GPT-2 built from a config that both train, the block
timer and the ratio's interval that both report, and the counter of device synchronisations.
Neither runner imports the other.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

#: ``cuda``: GPT-2 small's shape (124M parameters, sequence 1024, batch 8): a bf16 step of some
#: 30-100 ms on an H100, the step the cost is judged against (issue 29). ``cuda_oom``: a small
#: model for the out-of-memory runs, whose step time does not matter. ``cpu``: the smoke run.
SIZES = {"cuda": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab": 50257, "seq": 1024,
                  "batch": 8, "steps": 45, "pairs": 2},
         "cuda_oom": {"n_layer": 2, "n_head": 8, "n_embd": 512, "vocab": 8192, "seq": 256,
                      "batch": 16, "steps": 12, "pairs": 1},
         "cpu": {"n_layer": 1, "n_head": 2, "n_embd": 64, "vocab": 512, "seq": 32,
                 "batch": 4, "steps": 12, "pairs": 1}}

#: Steps between two timing stamps: the device is synchronised only there, so the steps in
#: between queue work as they do in a real run (a stamp per step would serialise CPU and GPU).
BLOCK = 5
WARM_BLOCKS = 1  # the first block of each run is left out (lazy initialisation, autotuning)


def spawn(args: list[str], res: Path, what: str, timeout: int,
          env_extra: dict[str, str]) -> dict[str, Any]:
    """Run ``python ARGS`` from the repository, which writes its result to ``res``; that result,
    or why there is none (a timeout, a crash: the end of its output)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **env_extra}
    try:
        r = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "what": what, "error": f"timed out after {timeout} s"}
    if res.exists():
        doc: dict[str, Any] = json.loads(res.read_text())
        doc.setdefault("what", what)
        return doc
    return {"status": "failed", "what": what, "exit": r.returncode,
            "error": (r.stdout + r.stderr)[-2000:]}


def write_result(res: Path, check: Any) -> int:
    """In a child: run ``check()`` and write its result to ``res`` (a missing package is "not
    run" with the reason; any other error "failed" with its traceback). Always exits 0."""
    try:
        doc = check()
    except ImportError as e:
        doc = {"status": "not run", "reason": f"a package is missing here: {e}"}
    except Exception as e:  # noqa: BLE001 - reported as a failed part with its traceback
        import traceback

        doc = {"status": "failed", "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()[-3000:]}
    res.write_text(json.dumps(doc, indent=1, default=str))
    return 0


class Ids:
    """Token ids of one fixed random batch, ``n`` of them: nothing to download or tokenise."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        return self.rows[i]


def gpt2(sz: dict[str, int]) -> Any:
    """A GPT-2 LM built from a config of ``sz`` (a :data:`SIZES` entry): nothing downloaded."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=sz["n_layer"], n_head=sz["n_head"], n_embd=sz["n_embd"],
                     vocab_size=sz["vocab"], n_positions=sz["seq"], bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg)


class Blocks:
    """Call at every step end: every :data:`BLOCK` steps it synchronises the device (CUDA only)
    and stamps the wall clock. :meth:`per_step` gives each block's mean step time, the warm-up
    block left out."""

    def __init__(self, device: str, block: int = BLOCK) -> None:
        self.device, self.block = device, block
        self.n = 0
        self.t: list[float] = []

    def __call__(self) -> None:
        if self.n % self.block == 0:
            if self.device == "cuda":
                import torch

                torch.cuda.synchronize()
            self.t.append(time.perf_counter())
        self.n += 1

    def per_step(self) -> list[float]:
        d = [(b - a) / self.block for a, b in zip(self.t, self.t[1:], strict=False)]
        return d[min(WARM_BLOCKS, len(d) // 4):]


def ratio_summary(on: list[float], off: list[float], limit: float = 1.01,
                  resamples: int = 2000) -> dict[str, Any]:
    """Median step time on over off, with a 95% bootstrap interval (blocks resampled within each
    variant, a fixed seed). ``above_limit``: the whole interval lies above ``limit``: memwatch
    costs more than that, beyond the measurement's noise."""
    r = statistics.median(on) / statistics.median(off)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(on, k=len(on)))
                   / statistics.median(rng.choices(off, k=len(off))) for _ in range(resamples))
    lo, hi = boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]
    return {"ratio": r, "interval_95": [lo, hi], "blocks": {"on": len(on), "off": len(off)},
            "median_step_ms": {"off": statistics.median(off) * 1e3,
                               "on": statistics.median(on) * 1e3},
            "limit": limit, "above_limit": lo > limit}


MEMWATCH_SRC = str(REPO / "src" / "memwatch")


class SyncCounter:
    """Counts the device synchronisations made while it is entered, under
    ``torch.cuda.set_sync_debug_mode("warn")``: each synchronising CUDA operation called from
    Python warns, and the warning is taken with the whole Python stack of the thread that made it
    (the background sampler's included). ``ours``: those with a memwatch frame on that stack.
    Not seen: a synchronisation made by C++ alone on a thread that runs no Python (the autograd
    engine's device threads), where memwatch runs no code."""

    TEXT = "synchronizing CUDA operation"

    def __init__(self) -> None:
        self.total = 0
        self.ours = 0
        self.where: dict[str, int] = {}

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        if self.TEXT not in str(message):
            return
        self.total += 1
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(MEMWATCH_SRC)]
        if frames:
            self.ours += 1
            key = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
            self.where[key] = self.where.get(key, 0) + 1

    def __enter__(self) -> SyncCounter:
        import torch

        self._cw = warnings.catch_warnings()
        self._cw.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.cuda.set_sync_debug_mode(0)
        self._cw.__exit__(*exc)

    def result(self) -> dict[str, Any]:
        return {"syncs_total": self.total, "syncs_memwatch": self.ours,
                "memwatch_sites": self.where}
