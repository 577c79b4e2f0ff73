"""What the GPU check's two child runners share (``gpu_parts.py``: the plain-loop parts;
``gpu_adapters.py``: the adapters): spawning a part in a child process and writing its result,
the expandable-segments environment, and the GPT-2 built from a config that both train. Neither
runner imports the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

#: A step whose time the GPU dominates on CUDA; seconds of CPU time on the smoke run.
SIZES = {"cuda": {"n_layer": 4, "n_head": 8, "n_embd": 512, "vocab": 8192, "seq": 256,
                  "batch": 16, "steps": 120, "pairs": 3},
         "cpu": {"n_layer": 1, "n_head": 2, "n_embd": 64, "vocab": 512, "seq": 32,
                 "batch": 4, "steps": 12, "pairs": 1}}


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
