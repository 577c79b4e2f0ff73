"""The seams between layers: what a sink receives, and the read-only view of a session that the
runtime parts (recorder, watchdog, exchange) and the reports are handed instead of the session.

Nothing here does anything; these are the shapes the layers agree on (see
``docs/architecture.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from memwatch.core.findings import Finding


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What one check of a session produced: the verdicts and the figures they were made from.

    A check runs at every epoch end (``at="epoch_end"``), inside long epochs every N steps or T
    seconds (``at="interval"``), and once more when the session closes, on what was seen since
    the previous check (``at="final"``: the run's last word).

    Attributes:
        stage: the loop the session watches ("train", "val", "test", "predict").
        epoch: the epoch the check belongs to; ``step``: the optimizer step it ran at.
        check: the session's check counter (0, 1, ...).
        findings: the new findings (maybe none), each complete.
        summary: the :class:`memwatch.timeline.EpochSummary` judged (an epoch, or the part of
            one since the previous check), or ``None``.
        rank_summaries: on rank 0 of a distributed run, one summary per rank after the
            exchange (``None`` for a rank that did not answer); empty otherwise.
        current: the session's current verdicts after this check
            (:meth:`memwatch.MemWatch.current_findings`: one per belief), what
            a sink shows as the run's answer; empty when the report was made elsewhere.
    """

    stage: str
    epoch: int
    step: int
    check: int
    at: str
    findings: Sequence[Finding]
    summary: Any = None
    rank_summaries: Sequence[Any] = ()
    current: Sequence[Finding] = ()


@runtime_checkable
class Sink(Protocol):
    """Where memwatch's samples, findings and bundles go (W&B, Prometheus, a JSONL file...).

    Required: the four methods below; every check (training and evaluation loops, epoch ends
    and checks inside epochs) reaches :meth:`on_check` as one :class:`CheckReport`. Optional,
    called when a sink has them: ``on_log(metrics, step)`` for logger-ready keys an integration
    reports outside checks (a recovered OOM, the bundle of a run that died). A sink that sets
    ``wants_final_bundle = True`` gets an end-of-run bundle (report and snapshot); its
    ``sink_name``, if any, names it in warnings.

    The older form, ``on_findings(epoch, findings, summary)`` instead of ``on_check``, still
    works (see :class:`FindingsSink`): such a sink hears about training checks only.
    """

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        """The latest sample, every ``log_every_n_steps`` steps."""

    def on_check(self, report: CheckReport) -> None:
        """A check ran: its stage, epoch, step, new findings (maybe none) and the summary
        judged."""

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """The flight recorder wrote a (redacted) bundle at ``path``; ``manifest`` is the one
        committed with it (its ``files`` list every file of the bundle)."""

    def close(self) -> None:
        """The session closes; flush and release. Called once."""


@runtime_checkable
class FindingsSink(Protocol):
    """The older sink form, still accepted: ``on_findings`` instead of ``on_check``, called for
    training checks only (evaluation loops never reach it)."""

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None: ...

    def on_findings(self, epoch: int, findings: Sequence[Finding], summary: Any) -> None:
        """A training check ran: its new findings (maybe none) and its ``EpochSummary``."""

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class SessionView(Protocol):
    """A read-only view of a running session: what the runtime parts may read, nothing else.

    The session hands one to its flight recorder, watchdog and rank exchange, and the reports
    read a live run through it; none of them gets the session itself.
    """

    @property
    def out_dir(self) -> str: ...

    @property
    def step_count(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def rank(self) -> Mapping[str, int]: ...

    @property
    def job(self) -> Mapping[str, Any]: ...

    @property
    def device(self) -> Any: ...

    @property
    def timeline(self) -> Any: ...

    @property
    def findings(self) -> Sequence[Finding]: ...

    @property
    def total_steps(self) -> int | None: ...

    @property
    def steps_per_epoch(self) -> int | None: ...

    def latest(self) -> dict[str, float]: ...

    def limits(self) -> dict[str, float]: ...

    def cgroup_info(self) -> dict[str, Any] | None:
        """Which memory cgroup is watched, its version and limit, and its OOM-kill counter at
        the session's start and now (``oom_kills_at_start``, ``oom_kills``); None without one."""
        ...

    def worker_reading(self, pid: int) -> dict[str, float] | None:
        """The last reading of DataLoader worker ``pid``, also after it died."""
        ...


class LiveRun(SessionView, Protocol):
    """What a report of a live run reads (:func:`memwatch.report.data.from_run`): the session's
    view plus its summaries, probes, state and bundles. :class:`memwatch.MemWatch` is one."""

    @property
    def epochs(self) -> Sequence[Any]: ...

    @property
    def running(self) -> bool: ...

    @property
    def disabled(self) -> Mapping[str, str]: ...

    @property
    def probes(self) -> Sequence[Any]: ...

    @property
    def recorder(self) -> Any: ...

    @property
    def checks(self) -> int: ...

    def current_findings(self) -> list[Finding]:
        """The run's current verdicts (one per belief)."""
        ...
