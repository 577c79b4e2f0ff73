"""Pieces the benchmark scripts share: where a run happened (host, versions) and summaries of the
time spent in memwatch's own hooks.

Not a benchmark (``run_all.py`` runs ``bench_*.py`` only). The scripts are run directly, by
``run_all.py``, and loaded by file path by the test fixtures (``benchmark_module``,
``quick_benchmark`` in the root ``conftest.py``), so none of them can rely on its own directory
being on ``sys.path``. Each puts the repository root there and imports ``from benchmarks import
_common``, as ``bench_detection.py`` imports ``benchmarks.scenarios``.

Every function returns plain JSON-ready values under the key names the results files already
had (``platform_info()`` gives ``accelerate_overhead.json``'s ``machine`` entry the order of
``detection.json``'s ``meta``: same keys and values).

At import this loads nothing that is not already loaded with torch and memwatch (``statistics``
is imported where it is used): ``bench_detection.py`` imports this module in each scenario's
child process too, and the corpus's RSS sizes were measured without those modules in the heap.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any


# --------------------------------------------------------------------------- host and versions
def load_avg_1min() -> float | None:
    """The machine's 1-minute load average (other jobs' load on a shared box); None off Unix."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def cpu_name() -> str:
    """What ``platform`` calls the CPU (often empty on Linux: then the architecture)."""
    return platform.processor() or platform.machine()


def host() -> dict[str, Any]:
    """``{"machine", "cpus", "load_avg_1min"}``: the ``host`` entry of the overhead results."""
    return {"machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg_1min": load_avg_1min()}


def versions(**frameworks: str) -> dict[str, str]:
    """``{"python", "torch", <frameworks...>, "memwatch"}``: the ``versions`` entry.

    ``frameworks`` are the libraries the benchmark drives, e.g. ``lightning=lightning.__version__``.
    """
    import torch

    import memwatch

    return {"python": platform.python_version(), "torch": torch.__version__, **frameworks,
            "memwatch": memwatch.__version__}


def platform_info() -> dict[str, Any]:
    """``{"python", "torch", "cpus", "platform"}`` (``torch`` None where it is not installed)."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    return {"python": platform.python_version(), "torch": torch_version,
            "cpus": os.cpu_count(), "platform": platform.platform()}


# --------------------------------------------------------------------------- hook timings
def hook_summary_us(hook_s: Sequence[float], base_step_ms: float,
                    thread_cpu_s: Sequence[float] | None = None) -> dict[str, float]:
    """A per-step hook's timings (seconds, one per call, at least one) in microseconds.

    ``median``, ``p99`` (the lower nearest rank), ``calls``, and ``implied_ratio``: what the
    hook's median alone adds to a median step of ``base_step_ms`` (the measured step ratios also
    carry the framework's cost of dispatching to one more callback, and the machine's noise).
    With ``thread_cpu_s`` (the same calls in thread CPU time), also ``thread_cpu_median``.
    """
    import statistics

    hooks = sorted(hook_s)
    med_us = statistics.median(hooks) * 1e6
    out: dict[str, float] = {
        "median": med_us, "p99": hooks[int(0.99 * (len(hooks) - 1))] * 1e6,
        "calls": len(hooks), "implied_ratio": (base_step_ms + med_us / 1e3) / base_step_ms,
    }
    if thread_cpu_s is not None:
        out["thread_cpu_median"] = statistics.median(thread_cpu_s) * 1e6
    return out


def median_p90_us(samples_s: Sequence[float]) -> dict[str, float]:
    """``{"median", "p90"}`` of per-call times (seconds, at least one) in microseconds."""
    import statistics

    s = sorted(samples_s)
    return {"median": statistics.median(s) * 1e6, "p90": s[int(len(s) * 0.9)] * 1e6}


def median_max_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """``{"median", "max"}`` of per-call times (seconds, at least one) in milliseconds: the
    epoch-end entries (verdicts, census) of the overhead results."""
    import statistics

    return {"median": statistics.median(samples_s) * 1e3, "max": max(samples_s) * 1e3}


# --------------------------------------------------------------------------- interleaved repeats
def repeat_row(got: dict[str, Any]) -> dict[str, float]:
    """One variant's figures in one repeat of an interleaved overhead benchmark, from the run's
    ``{"wall": [per-step seconds], "cpu": [...], "wall_s", "process_cpu_s"}``."""
    import statistics

    return {"median_s": statistics.median(got["wall"]), "mean_s": statistics.fmean(got["wall"]),
            "wall_s": got["wall_s"], "cpu_median_s": statistics.median(got["cpu"]),
            "process_cpu_s": got["process_cpu_s"]}


def print_repeat(r: int, repeats: int, per_repeat: dict[str, list[dict[str, float]]],
                 variants: Sequence[str]) -> None:
    """The progress line after a repeat: each variant's median step time."""
    print(f"repeat {r + 1}/{repeats}: " + "  ".join(
        f"{v} {per_repeat[v][-1]['median_s'] * 1e3:.3f} ms" for v in variants), flush=True)


def write_results(path: str | Path, quick: bool, **sections: Any) -> Path:
    """Write a benchmark's JSON (``meta``: platform, versions, ``quick``, load) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {**platform_info(), "quick": quick,
                                        "load_avg_1min": load_avg_1min()}, **sections},
                              indent=1))
    print(f"results written to {out}")
    return out


class MlpStep:
    """A small MLP trained on random data: a real CPU optimizer step of about a millisecond
    (``step(i)``; ``i`` is ignored). torch is imported when one is made, not with this module."""

    def __init__(self) -> None:
        import torch

        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(32, 64)

    def __call__(self, i: int = 0) -> None:
        loss = self.model(self.x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
