"""DataLoader worker memory: per-worker RSS, USS and PSS, discovered in the background.

PyTorch names its worker processes ``pt_data_worker`` (``/proc/<pid>/comm``). Non-persistent
workers get new pids every epoch, so discovery runs on every background read (a cheap walk of
``/proc/<pid>/task/*/children``, never ``psutil.Process().children()`` per step).

RSS summed over forked workers counts every copy-on-write page once per worker; USS (private
pages) and PSS (shared pages split between sharers) are the honest numbers.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from memwatch.probes import procfs

WORKER_COMM = "pt_data_worker"


@dataclasses.dataclass
class WorkerSample:
    t: float
    pid: int
    index: int
    rss: float
    uss: float
    pss: float


class WorkersProbe:
    """Memory of this process's DataLoader workers.

    ``is_worker`` decides which child processes count; by default those PyTorch named
    ``pt_data_worker``. Per-step reads return the latest background reading (O(1)).
    """

    name = "workers"
    fast_keys: tuple[str, ...] = ()
    slow_keys: tuple[str, ...] = (
        "workers.count",
        "workers.rss",
        "workers.uss",
        "workers.pss",
        "workers.max_uss",
    )

    def __init__(
        self,
        parent_pid: int | None = None,
        is_worker: Callable[[int], bool] | None = None,
        history: int = 4096,
    ) -> None:
        self._parent = parent_pid
        self._is_worker = is_worker or _is_pt_worker
        self._index: dict[int, int] = {}
        self.history: collections.deque[WorkerSample] = collections.deque(maxlen=history)
        self.seen_pids: set[int] = set()

    def discover(self) -> list[int]:
        parent = self._parent if self._parent is not None else os.getpid()
        return sorted(p for p in procfs.children_of(parent) if self._is_worker(p))

    def read_fast(self) -> Sequence[float]:
        return ()

    def read_slow(self) -> dict[str, float]:
        pids = self.discover()
        # Stable worker indexes: a worker keeps its slot while it lives; a new generation of
        # workers (non-persistent loaders, next epoch) is numbered from 0 again in pid order.
        live = set(pids)
        self._index = {p: i for p, i in self._index.items() if p in live}
        free = sorted(set(range(len(pids))) - set(self._index.values()))
        for p in pids:
            if p not in self._index:
                self._index[p] = free.pop(0) if free else len(self._index)
        now = time.time()
        tot_rss = tot_uss = tot_pss = max_uss = 0.0
        count = 0
        for p in pids:
            r = procfs.read_smaps_rollup(p)
            if r is None:  # exited between discovery and read: worker churn is normal
                continue
            count += 1
            self.seen_pids.add(p)
            tot_rss += r.rss
            tot_uss += r.uss
            tot_pss += r.pss
            max_uss = max(max_uss, r.uss)
            self.history.append(WorkerSample(now, p, self._index[p], r.rss, r.uss, r.pss))
        if count == 0:
            # No worker alive: the sums have no value (0 would read as "workers hold nothing"
            # and drag every floor to zero). Only the count is a reading.
            nan = float("nan")
            return {"workers.count": 0.0, "workers.rss": nan, "workers.uss": nan,
                    "workers.pss": nan, "workers.max_uss": nan}
        return {
            "workers.count": float(count),
            "workers.rss": tot_rss,
            "workers.uss": tot_uss,
            "workers.pss": tot_pss,
            "workers.max_uss": max_uss,
        }

    def per_worker(self) -> list[dict[str, float]]:
        """The latest reading of each worker seen in the last background pass."""
        latest: dict[int, WorkerSample] = {}
        for s in self.history:
            latest[s.pid] = s
        live = set(self._index)
        return [dataclasses.asdict(s) for p, s in sorted(latest.items()) if p in live]

    def last_reading(self, pid: int) -> dict[str, float] | None:
        """The last reading of worker ``pid``, also after it died (a killed worker's last USS)."""
        for s in reversed(self.history):
            if s.pid == pid:
                return dataclasses.asdict(s)
        return None

    def limits(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None


def _is_pt_worker(pid: int) -> bool:
    return procfs.read_comm(pid) == WORKER_COMM
