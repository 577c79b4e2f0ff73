"""Where to read RSS by kind (anonymous / file-backed / shared memory): the costs that decided it.

Rows, median and p99 of one call in microseconds (timer overhead subtracted):

* the per-step read as it is: one ``pread`` of ``/proc/self/statm``, resident field only;
* the same ``pread`` parsing ``shared`` too (resident - shared, shared): what a split on the hot
  path would add. ``shared`` is file-backed *plus* shared-memory pages, so it cannot tell a
  mapped file (reclaimable) from DataLoader batches in ``/dev/shm`` (not reclaimable);
* ``/proc/self/status`` parsed for RssAnon/RssFile/RssShmem: the three apart, read where memwatch
  reads it, on the background thread and after each check;
* ``/proc/self/smaps`` ranked by mapped file: what a ``mapped_file`` finding reads once, at a
  check, to name the files;
* the timeline's ``append`` of a row of 12 and of 15 values: the hot-path cost of carrying three
  more slow columns in every sample.

Usage: python benchmarks/rss_split_cost.py [N]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from memwatch.probes import procfs
from memwatch.timeline import Timeline


def timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    clock = time.perf_counter_ns
    empty = np.empty(2000, dtype=np.int64)
    for i in range(len(empty)):
        t0 = clock()
        empty[i] = clock() - t0
    overhead = float(np.median(empty))
    for _ in range(max(n // 10, 50)):
        fn()
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    us = np.maximum(out - overhead, 0) / 1000.0
    return float(np.median(us)), float(np.percentile(us, 99))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    page = procfs.PAGE_SIZE
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)

    def statm_split() -> tuple[float, float]:
        _, res, shared, _ = os.pread(fd, 128, 0).split(None, 3)
        r, s = int(res) * page, int(shared) * page
        return float(r - s), float(s)

    pid = os.getpid()
    row12, row15 = [1.0] * 12, [1.0] * 15
    tl12, tl15 = Timeline([f"k{i}" for i in range(12)]), Timeline([f"k{i}" for i in range(15)])
    steps = iter(range(10**9))
    rows: list[tuple[str, Callable[[], object], int]] = [
        ("statm pread, resident (per step now)", lambda: procfs.rss_from_statm_fd(fd), n),
        ("statm pread, resident + shared", statm_split, n),
        ("status: RssAnon/RssFile/RssShmem", lambda: procfs.read_rss_split(pid), n // 10),
        ("smaps: mapped files ranked", lambda: procfs.read_mapped_files(pid), 50),
        ("timeline append, 12 values", lambda: tl12.append(next(steps), 0.0, row12), n),
        ("timeline append, 15 values", lambda: tl15.append(next(steps), 0.0, row15), n),
    ]
    print(f"{'read':40} {'median us':>10} {'p99 us':>10}   calls")
    for name, fn, count in rows:
        med, p99 = timed(fn, count)
        print(f"{name:40} {med:10.2f} {p99:10.2f}   {count}")
    os.close(fd)


if __name__ == "__main__":
    main()
