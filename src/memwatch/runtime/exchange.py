"""Rank-aware memwatch: an epoch-end exchange of small per-rank summaries, and cross-rank verdicts.

Nothing is exchanged per step. At start rank 0 broadcasts the job id (one small object, so every
rank's bundles name the same job). At each epoch end every rank sends one small summary (floors,
peaks, limits and its findings: about 1-2 KiB pickled) to rank 0 over a gloo group memwatch
creates for itself, so the exchange works beside NCCL training and never touches the training's
own process group. A ``monitored_barrier`` with a timeout comes first: a rank that died (of OOM,
typically) or hangs is reported by name after the timeout instead of blocking rank 0 forever, and
the exchange then turns itself off for the rest of the run (a group with a dead member cannot be
trusted). At start it also opens the job's failure board (:mod:`memwatch.runtime.peers`): one
client of the rendezvous store, used only when a rank fails.

Cost at scale: gather_object to rank 0 moves ``world_size x summary`` bytes once per epoch; at
1,024 ranks and 2 KiB that is 2 MiB into rank 0 per epoch, plus a barrier (O(world_size) messages
to rank 0 with gloo's monitored barrier). Rank 0's analysis is O(world_size).
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import pickle
import re
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.protocols import SessionView
from memwatch.runtime import peers
from memwatch.runtime.launcher import job_identity, node_info, rank_info, safe_id
from memwatch.runtime.peers import FailureBoard

__all__ = ["SUMMARY_METRICS", "RankExchange", "dist_ready", "job_identity", "rank_info",
           "rank_payload"]

log = logging.getLogger("memwatch")

#: Metrics summarised per rank (the ones verdicts and imbalance are computed on).
SUMMARY_METRICS = ("device.allocated", "device.peak", "device.reserved", "host.rss", "workers.uss")


def dist_ready() -> Any | None:
    """``torch.distributed`` when it is initialised with more than one rank, else None.

    Never imports torch: a run that uses torch.distributed has imported it.
    """
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() > 1:
            return dist
    except Exception:  # noqa: BLE001
        return None
    return None


class RankExchange:
    """Gathers per-rank epoch summaries to rank 0, bounded by a timeout.

    Create it on every rank at the same point (``MemWatch.start()`` does): creating the group is a
    collective.
    """

    def __init__(self, dist: Any, timeout_s: float = 60.0,
                 job: dict[str, Any] | None = None) -> None:
        self.dist = dist
        self.rank = int(dist.get_rank())
        self.world_size = int(dist.get_world_size())
        self.timeout = datetime.timedelta(seconds=timeout_s)
        t0 = time.perf_counter()
        # Our own gloo group: CPU objects whatever the training backend, and none of our messages
        # interleave with the training's collectives.
        self.group = dist.new_group(backend="gloo", timeout=self.timeout)
        self.broken: str | None = None
        self.missing: list[int] = []
        self.last_bytes = 0
        self.last_ms = 0.0
        self.exchanges = 0
        #: The job identity every rank agrees on: rank 0's, sent once at start (one small
        #: broadcast, before the first step). Without a launcher id rank 0 makes one up, so the
        #: bundles of every rank of this run still group together (``memwatch ls``).
        self.job = self._agree_on_job(dict(job or {}))
        #: Where a failing rank tells the others it failed first (runtime.peers).
        self.board = FailureBoard.open(dist, self.job, self.rank)
        peers.use(self.board)
        #: Set-up cost paid once in start(): creating the group and agreeing on the job id.
        self.setup_ms = (time.perf_counter() - t0) * 1000.0

    def _agree_on_job(self, job: dict[str, Any]) -> dict[str, Any]:
        if self.rank == 0 and job.get("source") in (None, "MASTER_ADDR"):
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            job = {"id": safe_id(f"run-{socket.gethostname().split('.')[0]}-{stamp}-"
                                  f"{os.getpid()}"), "source": "rank0",
                   "attempt": job.get("attempt")}
        box: list[Any] = [job]
        try:
            self.dist.broadcast_object_list(box, src=0, group=self.group)
        except Exception as e:  # noqa: BLE001 - keep the local identity
            log.warning("memwatch: job id not agreed across ranks (%s: %s)", type(e).__name__, e)
            return job
        got = box[0]
        return dict(got) if isinstance(got, dict) else job

    def exchange(self, payload: dict[str, Any]) -> list[dict[str, Any] | None] | None:
        """Every rank calls this at its epoch end. Rank 0 gets one entry per rank (None for a rank
        that did not answer); other ranks get None."""
        if self.broken is not None:
            return None
        t0 = time.perf_counter()
        self.last_bytes = len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        try:
            self.dist.monitored_barrier(group=self.group, timeout=self.timeout,
                                        wait_all_ranks=True)
        except Exception as e:  # noqa: BLE001 - a dead or stuck rank: report, never hang again
            self.broken = f"{type(e).__name__}: {e}"
            self.missing = _ranks_in(str(e), self.world_size, self.rank)
            self.last_ms = (time.perf_counter() - t0) * 1000.0
            log.warning("memwatch: rank(s) %s did not reach the epoch-end exchange within %s; "
                        "cross-rank summaries are off for the rest of the run",
                        self.missing or "?", self.timeout)
            if self.rank == 0:
                out: list[dict[str, Any] | None] = [None] * self.world_size
                out[0] = payload
                return out
            return None
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        try:
            self.dist.gather_object(payload, gathered, dst=0, group=self.group)
        except Exception as e:  # noqa: BLE001
            self.broken = f"{type(e).__name__}: {e}"
            log.warning("memwatch: epoch-end gather failed (%s); cross-rank summaries are off",
                        self.broken)
            return None
        self.exchanges += 1
        self.last_ms = (time.perf_counter() - t0) * 1000.0
        return gathered

    def close(self) -> None:
        if peers.current() is self.board:
            peers.use(None)
        group, self.group = self.group, None
        if group is not None:
            try:
                self.dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - the default group may already be gone
                pass


def _ranks_in(message: str, world_size: int, me: int) -> list[int]:
    """Rank numbers named in a monitored_barrier error ("Ranks 1, 3 failed to pass ...")."""
    m = re.search(r"[Rr]anks?\s+([\d,\s]+)\s+failed", message)
    if m:
        return sorted({int(x) for x in re.findall(r"\d+", m.group(1)) if int(x) < world_size})
    if me != 0:
        return [0]
    return []


def rank_payload(view: SessionView, findings: Sequence[Finding], summary: Any) -> dict[str, Any]:
    """The small, picklable summary one rank contributes at an epoch end."""
    floors: dict[str, float] = {}
    peaks: dict[str, float] = {}
    if summary is not None:
        for m in SUMMARY_METRICS:
            if m in summary.keys:
                i = summary.keys.index(m)
                f, p = float(summary.floor[i]), float(summary.peak[i])
                if not math.isnan(f):
                    floors[m] = f
                if not math.isnan(p):
                    peaks[m] = p
    limits = {k: v for k, v in view.limits().items() if k in SUMMARY_METRICS}
    return {
        "rank": view.rank.get("rank", 0),
        "local_rank": view.rank.get("local_rank", 0),
        "host": socket.gethostname(),
        "node": node_info(view.rank),
        "epoch": getattr(summary, "epoch", None),
        "step": view.step_count,
        "time": time.time(),
        "floor": floors,
        "peak": peaks,
        "limits": limits,
        "findings": [
            {"kind": f.kind, "metric": f.metric, "severity": f.severity,
             "bytes_per_step": f.bytes_per_step, "steps_to_oom": f.steps_to_oom,
             "culprit": (f.culprit or "")[:300]}
            for f in findings if f.kind in ("leak", "near_oom", "fragmentation")
        ],
    }
