"""Which rank of a job failed first, told to the ranks its death takes down.

When a rank dies (of OOM, typically), the others learn it from their next collective, which fails
with the backend's words for a lost peer (``Connection closed by peer``, ``ncclRemoteError``...:
:mod:`memwatch.core.collective`), never with *which* rank died or why. So a rank that fails of its
own (an exception that gets a bundle, other than a peer failure) first leaves one record on the
job's rendezvous store, the key-value store every rank of a ``torch.distributed`` job already
reaches at ``MASTER_ADDR:MASTER_PORT`` (under torchrun the agent holds it, so it outlives the
workers). The store's atomic counter numbers the records in the order they arrive: record 1 is
the job's first failure. A rank whose collective then fails reads record 1 and its bundle names
that rank (``manifest["peer"]``), its node, what it died of and when.

A rank killed outright (SIGKILL, the kernel's OOM killer) leaves no record, and under torchrun
the store lives in node 0's agent: a peer on another node whose collective fails after that agent
exited cannot read it (its bundle says ``unreachable``). ``memwatch ls`` / ``inspect`` over the
job's out_dirs still order the bundles by time.

Cost: one store client opened at start, beside memwatch's gloo group (one TCP connection, no
thread of memwatch's); then nothing until a failure: one ``add`` and one ``set`` on the failing
rank, one ``add`` and one ``get`` on each peer, each bounded by :data:`STORE_TIMEOUT_S`. Keys live
under ``memwatch/<job id>/<attempt>/``, apart from torch's own. Never raises.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from memwatch.core.oom import OOM_KINDS, PEER_FAILURE
from memwatch.runtime.launcher import node_info

__all__ = ["STORE_TIMEOUT_S", "FailureBoard", "current", "job_fields", "on_failure", "use"]

log = logging.getLogger("memwatch")

#: How long one store operation may take: a store that does not answer within this is gone.
STORE_TIMEOUT_S = 3.0
_COUNTER = "failures"


class FailureBoard:
    """The job's failures in the order they reached the rendezvous store."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank

    @classmethod
    def open(cls, dist: Any, job: Mapping[str, Any], rank: int,
             env: Mapping[str, str] | None = None) -> FailureBoard | None:
        """A client of the job's store at ``MASTER_ADDR:MASTER_PORT``; None without them (a
        job initialised with ``init_method="tcp://..."`` or a file) or when it cannot connect."""
        env = os.environ if env is None else env
        addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
        if not addr or not port.isdigit():
            return None
        try:
            store = dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
            prefix = f"memwatch/{job.get('id')}/{job.get('attempt')}"  # PrefixStore adds "/"
            return cls(dist.PrefixStore(prefix, store), rank)
        except Exception as e:  # noqa: BLE001 - the board is optional
            log.info("memwatch: no failure board on %s:%s (%s: %s); a peer failure will not "
                     "name the rank that failed first", addr, port, type(e).__name__, e)
            return None

    def report(self, kind: str, node: Mapping[str, Any], when: float) -> int | None:
        """Record this rank's failure; its place in the job's order (1: the first)."""
        try:
            n = int(self.store.add(_COUNTER, 1))
            self.store.set(f"failure/{n}", json.dumps(
                {"rank": self.rank, "node": dict(node), "kind": kind, "time": when}))
            return n
        except Exception as e:  # noqa: BLE001
            log.info("memwatch: failure not recorded on the store (%s: %s)", type(e).__name__, e)
            return None

    def first(self) -> dict[str, Any] | None:
        """The first failure any rank recorded, or None when none did. Raises when the store
        cannot be read (under torchrun it lives in the torchrun agent of node 0, gone once that
        node's workers ended)."""
        if int(self.store.add(_COUNTER, 0)) < 1:
            return None
        doc = json.loads(self.store.get("failure/1"))
        return doc if isinstance(doc, dict) else None


_board: FailureBoard | None = None


def use(board: FailureBoard | None) -> None:
    """Make ``board`` this process's (one ``torch.distributed`` job per process)."""
    global _board
    _board = board


def current() -> FailureBoard | None:
    """This process's board, if its rank exchange opened one."""
    return _board


def on_failure(kind: str | None, rank: Mapping[str, int]) -> dict[str, Any] | None:
    """What a bundle of a failure of ``kind`` records of the job's other failures.

    This rank's own failure (an OOM, or another exception that gets a bundle) is recorded on the
    board first, and None is returned. For a peer failure: ``{"first": <the first failure on
    the board, or None>, "source": "store"}`` (with ``"unreachable": <why>`` when the store could
    not be read), or ``{"first": None, "source": None}`` without a board (the job's bundles still
    tell it: ``memwatch inspect``).
    """
    board = _board
    if kind is None or rank.get("world_size", 1) <= 1:
        return None
    if kind == PEER_FAILURE:
        if board is None:
            return {"first": None, "source": None}
        try:
            return {"first": board.first(), "source": "store"}
        except Exception as e:  # noqa: BLE001 - the store is gone: say so, never raise
            return {"first": None, "source": "store",
                    "unreachable": f"{type(e).__name__}: {e}"[:300]}
    if board is not None and (kind in OOM_KINDS or kind == "other"):
        board.report(kind, node_info(rank), time.time())
    return None


def job_fields(rank: Mapping[str, int], job: Mapping[str, Any] | None, kind: str | None,
               trigger: str) -> dict[str, Any]:
    """A bundle manifest's place in its job: ``rank``, ``local_rank``, ``world_size``, ``job``,
    ``node`` (:func:`memwatch.runtime.launcher.node_info`) and ``peer`` (what
    :func:`on_failure` says, for a failure of this rank: the bundle of an exception)."""
    return {
        "rank": rank.get("rank", 0), "local_rank": rank.get("local_rank", 0),
        "world_size": rank.get("world_size", 1), "job": dict(job or {}),
        "node": node_info(rank),
        "peer": on_failure(kind, rank) if trigger == "exception" else None,
    }
