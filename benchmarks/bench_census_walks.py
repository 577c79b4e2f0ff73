"""What weighing costs: the census on a process holding 3 million Python objects, with and
without the new walks (large containers recorded, autograd graphs counted, views claiming their
bases), and the weighing of the containers that grew.

The heap: 3 million live objects in all: small lists (tracked, walked, too short to record),
100,000 lists of 32 items and 20,000 dicts of 32 entries (recorded by length), 5,000 views of
64 KiB tensors, and a running sum kept with its graph for 20,000 steps (100,000 autograd
nodes, the graph walk's cut is 250,000). ``take_census()`` is timed three times per setting, the
median reported; the same heap is timed without the graph and the views (the census's floor).
Then 200 lists grow by 100 numpy arrays each and
:func:`memwatch.analysis.culprits.growth.weigh.weigh_growth` weighs the 12 that grew most, as the
attribution does at a check.

Prints a table and writes ``benchmarks/results/census_walks.json``. ``--quick``: 300,000
objects.
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
from benchmarks import _common  # noqa: E402

from memwatch.analysis.culprits.census import census  # noqa: E402

try:  # absent before issue 16: the census alone is timed then (the "before" figures)
    from memwatch.analysis.culprits.census import containers
    from memwatch.analysis.culprits.growth import weigh
except ImportError:
    weigh = None  # type: ignore[assignment]

RESULTS = REPO / "benchmarks" / "results" / "census_walks.json"


def _time_census(repeats: int = 3) -> tuple[float, Any]:
    times, c = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = census.take_census()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), c


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"Census of {rows[0]['objects']:,} live objects (median of 3)")
    print(f"{'heap':<28} {'objects':>10} {'census ms':>10} {'containers':>11} {'nodes':>8}")
    for r in rows:
        print(f"{r['heap']:<28} {r['objects']:>10,} {r['census_ms']:>10.0f} "
              f"{r['containers_recorded']:>11,} {r['graph_nodes']:>8,}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300,000 objects (smoke test)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    scale = 10 if args.quick else 1
    n_total = 3_000_000 // scale
    big_lists = [list(range(32)) for _ in range(100_000 // scale)]
    big_dicts = [{f"k{j}": [j] for j in range(32)} for _ in range(20_000 // scale)]
    small = [[i] for i in range(max(n_total - len(gc.get_objects()), 0))]
    rows = []
    ms, c = _time_census()
    rows.append({"heap": "containers only", "objects": c.objects, "census_ms": ms,
                 "containers_recorded": len(getattr(c, "containers", {})),
                 "graph_nodes": getattr(c, "graph_nodes", 0)})
    # the graph and the views
    lin = torch.nn.Linear(16, 16)
    total: Any = 0
    for _ in range(20_000 // scale):
        loss = lin(torch.randn(4, 16)).relu().mean()
        loss.backward()
        total = total + loss
    views = [torch.zeros(16_384).view(-1)[:4] for _ in range(5_000 // scale)]
    ms, c = _time_census()
    rows.append({"heap": "+ autograd chain + views", "objects": c.objects, "census_ms": ms,
                 "containers_recorded": len(getattr(c, "containers", {})),
                 "graph_nodes": getattr(c, "graph_nodes", 0)})
    if weigh is None:
        _print(rows)
        _common.write_results(args.out, args.quick, rows=rows)
        return 0
    # weighing what grew
    growing = [[] for _ in range(200)]
    prev = census.take_census()
    for lst in growing:
        lst.extend(np.zeros(1024) for _ in range(100))
    cur = census.take_census()
    t0 = time.perf_counter()
    grown = containers.container_growth(prev.containers, cur.containers)[:12]
    objs = weigh.objects_for({g.obj_id for g in grown})
    sc = weigh.Scale()
    for g in grown:
        if g.obj_id in objs:
            weigh.weigh_growth(g, objs[g.obj_id], sc)
    sc.close()
    weigh_ms = (time.perf_counter() - t0) * 1000.0
    weighed = sum(g.bytes_delta for g in grown)
    _print(rows)
    print(f"weighing the 12 containers that grew most (objects_for + weigh_growth): "
          f"{weigh_ms:.0f} ms, {weighed / 2**20:.1f} MiB weighed "
          f"(12 x 100 arrays of 8 KiB = {12 * 100 * 8304 / 2**20:.1f} MiB)")
    _common.write_results(args.out, args.quick, rows=rows, weigh_ms=weigh_ms,
                          weighed_bytes=weighed)
    del big_lists, big_dicts, small, views, total
    return 0


if __name__ == "__main__":
    sys.exit(main())
