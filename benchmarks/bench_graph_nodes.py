"""What one autograd node costs in native memory: the figure behind
``memwatch.analysis.culprits.census.graphs.NODE_BYTES``.

A running sum kept with its graph (``total = total + loss``) chains every step's graph onto one
tensor. This measures glibc's in-use bytes (``mallinfo2``: ``uordblks + hblkhd``, after
``gc.collect()``) per step and per node of such a chain, for two small losses whose
``backward()`` ran (saved tensors freed: what stays is the nodes) and for one without
``backward()`` (saved tensors kept). Linux/glibc only.

Prints a table and writes ``benchmarks/results/graph_nodes.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from benchmarks import _common  # noqa: E402

from memwatch.analysis.culprits.census import graphs  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "graph_nodes.json"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                .split()]


def _in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    m = libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


def _nodes(t: Any) -> int:
    w = graphs.GraphWalk(max_nodes=10_000_000)
    try:
        return w.add(t)
    finally:
        w.close()


def measure(name: str, loss_of: Any, steps: int, backward: bool) -> dict[str, Any]:
    x = torch.randn(8, 64)
    total: Any = 0
    for _ in range(50):  # warm-up: the allocator's first pools
        loss = loss_of(x)
        if backward:
            loss.backward()
        total = total + loss
    b0, n0 = _in_use(), _nodes(total)
    for _ in range(steps):
        loss = loss_of(x)
        if backward:
            loss.backward()
        total = total + loss
    del loss
    b1, n1 = _in_use(), _nodes(total)
    return {"case": name, "steps": steps, "bytes_per_step": (b1 - b0) / steps,
            "nodes_per_step": (n1 - n0) / steps, "bytes_per_node": (b1 - b0) / (n1 - n0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke test)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("needs glibc's mallinfo2 (Linux)")
        return 0
    steps = 500 if args.quick else 3000
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lin = torch.nn.Linear(64, 64)
    rows = [
        measure("relu + mean, backward() ran", lambda x: lin(x).relu().mean(), steps, True),
        measure("mse loss, backward() ran",
                lambda x: torch.nn.functional.mse_loss(lin(x), x), steps, True),
        measure("relu + mean, no backward()", lambda x: lin(x).relu().mean(), steps, False),
    ]
    print(f"{'case':<30} {'B/step':>8} {'nodes/step':>11} {'B/node':>8}")
    for r in rows:
        print(f"{r['case']:<30} {r['bytes_per_step']:>8.0f} {r['nodes_per_step']:>11.1f} "
              f"{r['bytes_per_node']:>8.0f}")
    print(f"memwatch's estimate: NODE_BYTES = {graphs.NODE_BYTES} per node, plus the saved "
          "tensors read from the nodes")
    _common.write_results(args.out, args.quick, rows=rows, node_bytes=graphs.NODE_BYTES,
                          torch=torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
