"""The read-only view of a session that its runtime parts are handed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.protocols import LiveRun

__all__ = ["SessionReader"]


class SessionReader:
    """The read-only :class:`memwatch.core.protocols.SessionView` of one :class:`MemWatch`:
    what the flight recorder, the watchdog and the rank exchange may read of it, live, and
    nothing else (there is nothing else to read, and nothing can be set).

    Example::

        >>> import memwatch
        >>> mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp))
        >>> mw.view.step_count, mw.view.out_dir == str(tmp)
        (0, True)
        >>> mw.view.recorder  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AttributeError: 'SessionReader' object has no attribute 'recorder'
    """

    __slots__ = ("_mw",)
    _mw: LiveRun

    def __init__(self, mw: LiveRun) -> None:
        object.__setattr__(self, "_mw", mw)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a session view is read-only")

    @property
    def out_dir(self) -> str:
        return self._mw.out_dir

    @property
    def step_count(self) -> int:
        return self._mw.step_count

    @property
    def epoch(self) -> int:
        return self._mw.epoch

    @property
    def rank(self) -> Any:
        return self._mw.rank

    @property
    def job(self) -> Any:
        return self._mw.job

    @property
    def device(self) -> Any:
        return self._mw.device

    @property
    def timeline(self) -> Any:
        return self._mw.timeline

    @property
    def total_steps(self) -> int | None:
        return self._mw.total_steps

    @property
    def steps_per_epoch(self) -> int | None:
        return self._mw.steps_per_epoch

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
