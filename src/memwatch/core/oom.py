"""Classify an exception as an out-of-memory error and parse the numbers in its message.

Classes: ``cuda_oom`` (``torch.OutOfMemoryError``, "CUDA/HIP out of memory", and
:class:`memwatch.testing.FakeDevice`'s imitation), ``mps_oom`` ("MPS backend out of memory"),
``host_oom`` (``MemoryError``, the CPU allocator's "DefaultCPUAllocator: can't allocate memory",
``OSError`` ENOMEM such as a failed ``fork()`` of a DataLoader worker), ``peer_failure`` (a
collective of a distributed job that failed because another rank died or never came:
:mod:`memwatch.core.collective`; an OOM in the chain wins over it) and ``other``. The
cause/context chain is searched too: frameworks often wrap an OOM.

A DataLoader worker killed by the kernel's OOM killer raises no OOM error at all: the loop sees
the worker die ("DataLoader worker (pid N) is killed by signal: Killed.", "... exited
unexpectedly") or a half-received batch (``EOFError``, ``ConnectionResetError``,
``ConnectionRefusedError``). Only the memory cgroup's OOM-kill counter tells it was memory:
``classify(exc, kernel_oom_kills=n)`` with the counter's rise since the run started makes such
an error ``host_oom`` (``numbers``: ``kernel_oom_kills``, ``worker_pid`` when the message names
one); without a rise it stays ``other``.

Example::

    >>> from memwatch.core.oom import classify
    >>> c = classify(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    ...                           "total capacity of 15.78 GiB of which 1.50 GiB is free."))
    >>> c.kind, c.numbers["tried_to_allocate"], c.numbers["free"]
    ('cuda_oom', 2147483648, 1610612736)
"""

from __future__ import annotations

import dataclasses
import errno
import re
from typing import Any

from memwatch.core.collective import peer_failure

__all__ = ["OOM_KINDS", "PEER_FAILURE", "Classification", "classify", "parse_oom_message",
           "worker_death"]

OOM_KINDS: tuple[str, ...] = ("cuda_oom", "host_oom", "mps_oom")
#: A collective failed because another rank died: a consequence, whose story is on that rank.
PEER_FAILURE = "peer_failure"
KINDS: tuple[str, ...] = (*OOM_KINDS, PEER_FAILURE, "other")

# torch's format_size prints binary units; the MPS message labels them GB/MB but means GiB/MiB.
_UNITS = {
    "bytes": 1, "byte": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40,
}
_SIZE = r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B|bytes?)"

# (field, pattern) pairs for the current and older CUDA messages, MPS and the CPU allocator.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pat, re.IGNORECASE))
    for name, pat in (
        ("tried_to_allocate", r"tried to allocate " + _SIZE),
        ("total_capacity", r"total capacity of " + _SIZE),
        ("total_capacity", _SIZE + r" total capacity"),
        ("free", r"of which " + _SIZE + r" is free"),
        ("free", _SIZE + r" free\b"),
        ("in_use_by_process", r"this process has " + _SIZE + r" memory in use"),
        ("allocated_by_pytorch", _SIZE + r" is allocated by PyTorch"),
        ("allocated_by_pytorch", _SIZE + r" already allocated"),
        ("reserved_unallocated", _SIZE + r" is reserved by PyTorch but unallocated"),
        ("reserved_by_pytorch", _SIZE + r" reserved in total by PyTorch"),
        ("mps_allocated", r"MPS allocated: " + _SIZE),
        ("mps_other_allocations", r"other allocations: " + _SIZE),
        ("mps_max_allowed", r"max allowed: " + _SIZE),
    )
)
# The caching allocator's message, plus allocations made outside it (CUDA context, cuBLAS
# workspaces, NCCL buffers) that fail with the runtime's own out-of-memory error.
_CUDA_OOM_MESSAGES = ("CUDA out of memory", "HIP out of memory", "CUDA error: out of memory",
                      "HIP error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED")
_GPU_RE = re.compile(r"GPU (\d+)")
#: How a DataLoader worker's death reaches the training loop (torch's messages, and the errors
#: of a batch half received from a worker that died: see docs/notes-kernel-oom.md).
_WORKER_DEATH_RE = re.compile(r"DataLoader worker \(pid(?:\(s\))? (\d+)[^)]*\) "
                              r"(?:is killed by signal|exited unexpectedly)")
_HALF_RECEIVED = (EOFError, ConnectionResetError, ConnectionRefusedError, BrokenPipeError)
_CPU_BYTES_RE = re.compile(r"you tried to allocate (\d+) bytes", re.IGNORECASE)


@dataclasses.dataclass
class Classification:
    """What kind of failure an exception is, and the figures its message gives."""

    kind: str  # one of KINDS
    exception: BaseException  # the exception in the chain that was recognised
    numbers: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def is_oom(self) -> bool:
        return self.kind in OOM_KINDS

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "is_oom": self.is_oom,
                "matched_type": _qualname(type(self.exception)), "numbers": dict(self.numbers)}


def _qualname(t: type) -> str:
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def _to_bytes(num: str, unit: str) -> int:
    return int(round(float(num) * _UNITS[unit.lower()]))


def parse_oom_message(message: str) -> dict[str, int]:
    """Every figure an OOM message states, in bytes (plus ``gpu`` index when given)."""
    out: dict[str, int] = {}
    m = _CPU_BYTES_RE.search(message)
    if m:
        out["tried_to_allocate"] = int(m.group(1))
    for name, pat in _PATTERNS:
        if name in out:
            continue
        m = pat.search(message)
        if m:
            out[name] = _to_bytes(m.group("num"), m.group("unit"))
    g = _GPU_RE.search(message)
    if g:
        out["gpu"] = int(g.group(1))
    return out


def _kind_of(exc: BaseException) -> str:
    msg = str(exc) if exc.args else ""
    t = type(exc)
    if "MPS backend out of memory" in msg:
        return "mps_oom"
    if any(m in msg for m in _CUDA_OOM_MESSAGES):
        return "cuda_oom"
    names = {c.__name__ for c in t.__mro__}
    if "OutOfMemoryError" in names and (
        t.__module__.startswith("torch") or t.__name__ == "FakeOutOfMemoryError"
    ):
        return "cuda_oom"
    if isinstance(exc, MemoryError) or "DefaultCPUAllocator: can't allocate memory" in msg:
        return "host_oom"
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return "host_oom"  # fork() of a DataLoader worker, mmap, a pinned-memory buffer
    return "other"


def _chain(exc: BaseException, limit: int = 8) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(seen) < limit and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def worker_death(exc: BaseException) -> tuple[BaseException, int | None] | None:
    """The exception of ``exc``'s chain that says a DataLoader worker died (or that a batch was
    cut off), with the worker's pid where the message names one; None when none does."""
    half: BaseException | None = None
    for e in _chain(exc):
        m = _WORKER_DEATH_RE.search(str(e) if e.args else "")
        if m:
            return e, int(m.group(1))
        if half is None and isinstance(e, _HALF_RECEIVED):
            half = e
    return (half, None) if half is not None else None


def classify(exc: BaseException, kernel_oom_kills: int = 0) -> Classification:
    """Classify ``exc`` (or the first OOM in its cause/context chain).

    ``kernel_oom_kills``: how many processes the kernel's OOM killer killed in this run's memory
    cgroup since the run started; when above 0, a worker's death is a ``host_oom``.

    >>> err = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    >>> classify(err).kind, classify(err, kernel_oom_kills=1).numbers["worker_pid"]
    ('other', 4242)
    """
    if kernel_oom_kills > 0:
        death = worker_death(exc)
        if death is not None:
            numbers = {"kernel_oom_kills": int(kernel_oom_kills)}
            if death[1] is not None:
                numbers["worker_pid"] = death[1]
            return Classification("host_oom", death[0], numbers)
    for e in _chain(exc):
        kind = _kind_of(e)
        if kind != "other":
            try:
                numbers = parse_oom_message(str(e))
            except Exception:  # noqa: BLE001 - a weird __str__ must not break classification
                numbers = {}
            return Classification(kind, e, numbers)
    peer = peer_failure(exc)
    if peer is not None:
        return Classification(PEER_FAILURE, peer, {})
    return Classification("other", exc, {})
