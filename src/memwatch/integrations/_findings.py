"""The findings of every session of one adapter, training and evaluation loops alike
(:class:`AdapterFindings`): each check reports them to it (a sink on the adapter's
:class:`~memwatch.runtime.dispatch.SinkSet`), it keeps them, and it tells them on the console
once each, labelled with the rank and the loop, when the framework's call returns."""

from __future__ import annotations

from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.protocols import CheckReport
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.warn import FindingWarner
from memwatch.sinks.base import NullSink

__all__ = ["AdapterFindings"]

#: Findings kept (the latest), like a session's own list.
MAX_FINDINGS = 1000


class _Tap(NullSink):
    """Every check's findings, then ``None`` for the check's end: ``(at, stage, finding)``."""

    sink_name = "the adapter's findings"

    def __init__(self, into: list[tuple[str, str, Finding | None]]) -> None:
        self.into = into

    def on_check(self, report: CheckReport) -> None:
        self.into.extend((report.at, report.stage, f) for f in report.findings)
        self.into.append((report.at, report.stage, None))


class AdapterFindings:
    """What the checks of one adapter's sessions found.

    Args:
        sinks: the adapter's fan-out; every check of every session of the adapter (epoch
            ends, and checks inside epochs, which happen inside ``mw.step()``) reaches it.
        warn: warn once per new finding of severity warning or critical (without it, a new
            leak still gets its one-line notice).
        stage_labels: how warnings name a loop (``{"val": "val loop"}``).

    Attributes:
        kept: every finding so far (the latest :data:`MAX_FINDINGS`).
        warner: what was said on the console (kept across a checkpoint).
        rank_label: how warnings name this process's rank (``" [rank 1]"``; none alone).
    """

    def __init__(self, sinks: SinkSet, *, warn: bool = True,
                 stage_labels: dict[str, str] | None = None) -> None:
        self._fresh: list[tuple[str, str, Finding | None]] = []
        self._sinks = sinks
        sinks.add(_Tap(self._fresh))
        self.warn = bool(warn)
        self.stage_labels = {"val": "val loop", "test": "test loop", "predict": "predict loop",
                             **(stage_labels or {})}
        self.kept: list[Finding] = []
        self.warner = FindingWarner()
        self.rank_label = ""

    @property
    def pending(self) -> bool:
        """A check reported findings not taken yet."""
        return bool(self._fresh)

    def take(self) -> list[Finding]:
        """The findings the checks reported since last time: kept, and told (outside the sinks'
        dispatch: a warnings filter set to "error" is the user's to see)."""
        fresh, self._fresh[:] = list(self._fresh), []
        new = [f for _, _, f in fresh if f is not None]
        self.kept.extend(new)
        del self.kept[:-MAX_FINDINGS]
        # Threats are warned about (warn=True); every new leak, whatever its severity, reaches
        # the console once (runtime/warn.py); other info findings stay silent, so a clean run
        # is quiet. A session the user passed, which warns itself, said its own already. A
        # sink that says every verdict on the console itself (memwatch run's) is the one line
        # per verdict: no warning or notice beside it.
        told = any(getattr(s, "tells_findings", False) for s in self._sinks)
        for at, stage, f in fresh:
            if told:
                continue
            if f is None:  # a check's end: a notice that waited a check for its holder
                self.warner.end_check(at, stage)
                continue
            labels = self.rank_label
            if f.stage != "train":
                labels += f" [{self.stage_labels.get(f.stage, f.stage)}]"
            # (the last word at a close: a line on the log, never a warning raised under -W
            # error out of close())
            self.warner.tell([f], labels, warn=self.warn and at != "final", at=at)
        return new

    def restore(self, findings: list[Finding], warned: set[tuple[str, str, str]]) -> None:
        """What a checkpoint kept: the findings so far and what was said of them."""
        self.kept = list(findings)
        self.warner.warned = warned

    def state(self) -> dict[str, Any]:
        """The findings and what was said, as plain data for a checkpoint."""
        from memwatch.runtime.resume import plain

        return {"findings": [plain(f.to_dict()) for f in self.kept],
                "warned": [list(k) for k in sorted(self.warner.warned)]}

    def close(self) -> None:
        """What the closing checks found, told; waiting notices said."""
        self.take()
        self.warner.flush()
