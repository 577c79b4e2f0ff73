"""Cost of one CgroupProbe.read_slow (and of oom_kills()): median and p90 over N reads.

Usage: python benchmarks/cgroup_probe_cost.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time

from memwatch.probes.cgroup import CgroupProbe


def bench(fn, n: int) -> tuple[float, float]:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return statistics.median(ts) / 1e3, ts[int(0.9 * n)] / 1e3


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    p = CgroupProbe()
    print("probe:", p.describe())
    med, p90 = bench(p.read_slow, n)
    print(f"read_slow: median {med:.1f} us, p90 {p90:.1f} us over {n}")
    med, p90 = bench(p.oom_kills, n)
    print(f"oom_kills: median {med:.1f} us, p90 {p90:.1f} us over {n}")
    p.close()


if __name__ == "__main__":
    main()
