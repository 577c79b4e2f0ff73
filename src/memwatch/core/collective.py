"""Recognise a collective that failed because another rank died: a *peer failure*.

When one rank of a job dies (of OOM, typically), every other rank learns it from its next
collective, which fails with the communication backend's words for a lost peer, never with the
reason the peer died. Those ranks did not fail of their own: their error is a consequence, and the
story of the job is the rank that failed first. The words, as the backends write them:

* gloo (``third_party/gloo/gloo/transport/tcp/pair.cc``): ``Connection closed by peer [addr]:port``,
  ``Read error [addr]:port: Connection reset by peer``, ``Connection refused``, ``Broken pipe``,
  ``Timed out waiting 30000ms for recv operation to complete``, ``Socket Timeout``,
  ``Application timeout caused pair closure``;
* NCCL (``ProcessGroupNCCL``): ``ncclRemoteError: A call failed possibly due to a network error or a
  remote process exiting prematurely``, ``NCCL communicator was aborted on rank N``,
  ``Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds before
  timing out``, ``Some NCCL operations have failed or timed out``;
* c10d itself: ``Rank 1 failed to pass monitoredBarrier``, the store's ``failed to recv, got 0
  bytes`` and ``Connection reset by peer`` (``DistNetworkError``).

Those words are matched only where the error comes from ``torch.distributed``: the message names a
backend (``gloo``, ``NCCL``, ``c10d``, ``ProcessGroup``...) or the exception is one of
``torch.distributed``'s own (``DistBackendError``, ``DistNetworkError``, ``DistStoreError``). A
DataLoader worker's half-received batch (``ConnectionResetError``) is not a peer failure.

A collective that *timed out* is counted too: a peer that never arrived is dead or stuck, and in
both cases the story is on that peer.

Example::

    >>> peer_failure(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    ...                           "Connection closed by peer [127.0.0.1]:41234")) is not None
    True
    >>> peer_failure(ConnectionResetError(104, "Connection reset by peer")) is None
    True
"""

from __future__ import annotations

import re

__all__ = ["PEER_WORDS", "peer_failure"]

#: What a backend says when a peer is gone (or never came).
PEER_WORDS = re.compile(
    r"connection closed by (?:remote )?peer|connection reset by peer|connection refused"
    r"|broken pipe|timed out waiting \d+ ?ms for (?:recv|send)|socket timeout"
    r"|timeout caused pair closure|ncclRemoteError|remote process exit"
    r"|communicator was aborted|watchdog caught collective operation timeout"
    r"|NCCL operations have failed or timed out|failed to pass monitoredBarrier"
    r"|failed to recv, got 0 bytes",
    re.IGNORECASE)
#: Where the error comes from: the message names a torch.distributed backend.
_DIST_SOURCE = re.compile(r"gloo|nccl|c10d|ProcessGroup|pair\.cc|TCPStore|monitoredBarrier",
                          re.IGNORECASE)
_DIST_TYPES = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")


def _from_dist(exc: BaseException, msg: str) -> bool:
    t = type(exc)
    if t.__module__.startswith("torch") and \
            any(c.__name__ in _DIST_TYPES for c in t.__mro__):
        return True
    return _DIST_SOURCE.search(msg) is not None


def peer_failure(exc: BaseException, limit: int = 8) -> BaseException | None:
    """The exception of ``exc``'s cause/context chain that says a collective lost a peer (see the
    module doc), or None."""
    cur: BaseException | None = exc
    seen: list[BaseException] = []
    while cur is not None and len(seen) < limit and all(cur is not s for s in seen):
        seen.append(cur)
        try:
            msg = str(cur) if cur.args else ""
        except Exception:  # noqa: BLE001 - a weird __str__ is not a peer failure
            msg = ""
        if PEER_WORDS.search(msg) and _from_dist(cur, msg):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None
