"""The read-only view of a session that its runtime parts are handed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.protocols import LiveRun

__all__ = ["SessionReader"]

#: What a :class:`memwatch.core.protocols.SessionView` may read of the session, as it is.
_READABLE = frozenset({"out_dir", "step_count", "epoch", "rank", "job", "device", "timeline",
                       "total_steps"})


class SessionReader:
    """The read-only :class:`memwatch.core.protocols.SessionView` of one :class:`MemWatch`:
    what the flight recorder, the watchdog and the rank exchange may read of it, live, and
    nothing else (reading anything more raises AttributeError; nothing can be set).

    Example::

        >>> import memwatch
        >>> mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp))
        >>> mw.view.step_count, mw.view.out_dir == str(tmp)
        (0, True)
        >>> mw.view.recorder  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AttributeError: a session view reads only: cgroup_info(), device, epoch, findings, ...
    """

    __slots__ = ("_mw",)
    _mw: LiveRun

    def __init__(self, mw: LiveRun) -> None:
        object.__setattr__(self, "_mw", mw)

    def __getattr__(self, name: str) -> Any:
        if name in _READABLE:
            return getattr(self._mw, name)
        shown = sorted([*_READABLE, "findings", "latest()", "limits()", "cgroup_info()",
                        "worker_reading()"])
        raise AttributeError(f"a session view reads only: {', '.join(shown)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a session view is read-only")

    @property
    def findings(self) -> Sequence[Finding]:
        return tuple(self._mw.findings)

    def latest(self) -> dict[str, float]:
        return self._mw.latest()

    def limits(self) -> dict[str, float]:
        return self._mw.limits()

    def cgroup_info(self) -> dict[str, Any] | None:
        return self._mw.cgroup_info()

    def worker_reading(self, pid: int) -> dict[str, float] | None:
        return self._mw.worker_reading(pid)
