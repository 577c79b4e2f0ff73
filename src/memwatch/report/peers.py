"""How a job's story tells the ranks that failed because another rank died (``peer_failure``).

When one rank of a job dies, the others fail in their next collective ("Connection closed by
peer", an NCCL abort or timeout: :mod:`memwatch.core.collective`) and write bundles classified
``peer_failure``: their failure is a consequence. The job's first failure is then the earliest
failure of a rank's *own* (:meth:`memwatch.report.jobs.Job.first_failure`), and these words say
what the others were, naming the rank the job's store recorded as the first to fail
(``manifest["peer"]``, :mod:`memwatch.runtime.peers`) where the dead rank left no bundle.

Example::

    >>> named = {"rank": 3, "node": {"name": "node1"}, "kind": "host_oom"}
    >>> note = peer_note([0, 1, 2], first_rank=3, first_is_own=True, named=named)
    >>> note.startswith("Rank(s) 0, 1, 2 failed because their collective lost a peer")
    True
    >>> note.endswith("the job's store told them rank 3 on node1 failed first (host_oom).")
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["named_first", "peer_note", "peer_who"]


def named_first(manifests: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first failure the job's store named in any peer-failure bundle's manifest."""
    for m in manifests:
        peer = m.get("peer")
        first = peer.get("first") if isinstance(peer, dict) else None
        if isinstance(first, dict) and isinstance(first.get("rank"), int):
            return first
    return None


def peer_who(named: Mapping[str, Any]) -> str:
    """``rank 3 on node1 failed first (host_oom)``, from a store record."""
    node = named.get("node")
    name = node.get("name") if isinstance(node, dict) else None
    return f"rank {named['rank']}" + (f" on {name}" if name else "") + \
        (f" failed first ({named['kind']})" if named.get("kind") else " failed first")


def peer_note(peer_ranks: Sequence[int], first_rank: int, first_is_own: bool,
              named: Mapping[str, Any] | None) -> str:
    """One paragraph on the ranks whose collective lost a peer (``peer_ranks``), given the job's
    first failure (``first_rank``, a failure of its own or not) and what the store named."""
    ranks = ", ".join(map(str, peer_ranks))
    what = ("failed because their collective lost a peer (peer_failure: the backend's "
            "\"connection closed\", abort or timeout)")
    if first_is_own:
        told = f"; the job's store told them {peer_who(named)}" if named else ""
        return f"Rank(s) {ranks} {what}: the job's own failure is rank {first_rank}'s{told}."
    if named:
        return (f"No bundle records a failure of a rank's own: rank(s) {ranks} {what}; the "
                f"job's store names {peer_who(named)}: look for that rank's bundle in its node's "
                "out_dir.")
    return (f"No bundle records a failure of a rank's own: rank(s) {ranks} {what}, and the "
            "job's store named no rank (none recorded its failure there, or the store was gone "
            "when they asked): the rank that died was killed outright (SIGKILL, the kernel's "
            "OOM killer), or its node's out_dir is not among those read.")
