"""The read-only view of a session that its runtime parts are handed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memwatch.core.findings import Finding

if TYPE_CHECKING:
    from memwatch.session.session import MemWatch

__all__ = ["SessionReader"]


class SessionReader:
    """The read-only :class:`memwatch.core.protocols.SessionView` of one :class:`MemWatch`:
    what the flight recorder, the watchdog and the rank exchange may read of it."""

    __slots__ = ("_mw",)

    def __init__(self, mw: MemWatch) -> None:
        self._mw = mw

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
    def rank(self) -> Mapping[str, int]:
        return self._mw.rank

    @property
    def job(self) -> Mapping[str, Any]:
        return self._mw.job

    @property
    def device(self) -> Any:
        return self._mw.device

    @property
    def timeline(self) -> Any:
        return self._mw.timeline

    @property
    def findings(self) -> Sequence[Finding]:
        return tuple(self._mw.findings)

    @property
    def total_steps(self) -> int | None:
        return self._mw.total_steps

    def latest(self) -> dict[str, float]:
        return self._mw.latest()

    def limits(self) -> dict[str, float]:
        return self._mw.limits()
