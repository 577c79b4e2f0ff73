"""What issue 41's census costs on a framework's heap: ``take_census()`` in CPU time on a process
that imported torch, transformers and Lightning and built a tiny BERT (about 380,000 objects, a
few hundred functools caches), and what a failure or a dead-end walk adds: the census of large
Python buffers (``census.large``), the index of numpy arrays over tensors (``holders.untracked``)
and the killer (``killer.name_killer``), which run only at an OOM or when a holder walk meets a
tensor nothing tracked refers to.

CPU seconds of this thread (``time.thread_time``), median of ``--repeats`` (default 5): the
machine's load stretches wall time, not the work. Run it on two trees to compare: the parts a
tree lacks are left out (``PYTHONPATH=<old>/src python benchmarks/bench_census_framework.py``).

Prints a table and writes ``benchmarks/results/census_framework.json``; ``--quick``: 3 repeats.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import _common  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "census_framework.json"


def _cpu_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        out = fn()
        times.append((time.thread_time() - t0) * 1000.0)
        close = getattr(out, "close", None)
        if close is not None:
            close()
        del out
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    import lightning  # noqa: F401 - its heap is part of a framework's
    import numpy as np
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    import memwatch
    from memwatch.analysis.culprits.census import census

    torch.set_num_threads(1)
    model = BertForSequenceClassification(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=1000))
    kept = [np.zeros(1 << 18) for _ in range(16)]  # 16 arrays of 2 MiB: large buffers
    gc.collect()
    objects = len(gc.get_objects())
    rows: dict[str, Any] = {"objects": objects, "memwatch": str(Path(memwatch.__file__).parent)}
    rows["census_ms"] = _cpu_ms(lambda: census.take_census(), repeats)
    c = census.take_census()
    rows["containers_recorded"] = len(c.containers)
    rows["caches_recorded"] = sum(1 for _, kind in c.containers.values() if kind == "cache")
    del c
    try:
        from memwatch.analysis.culprits.census.large import large_buffers
        rows["large_buffers_ms"] = _cpu_ms(lambda: large_buffers(), repeats)
    except ImportError:
        pass
    try:
        from memwatch.analysis.culprits.holders.untracked import ArrayBases

        def index() -> Any:
            a = ArrayBases(budget_s=10.0)
            a.arrays_on(model)
            return a
        rows["array_index_ms"] = _cpu_ms(index, repeats)
    except ImportError:
        pass
    try:
        from memwatch.analysis.culprits import killer
        rows["killer_ms"] = _cpu_ms(lambda: killer.name_killer(budget_s=10.0), repeats)
    except ImportError:
        pass
    print(f"census of {objects:,} objects (CPU ms of this thread, median of {repeats})")
    for k, v in rows.items():
        print(f"  {k:<22} {v:>10.1f}" if isinstance(v, float) else f"  {k:<22} {v}")
    _common.write_results(args.out, args.quick, **rows)
    del kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
