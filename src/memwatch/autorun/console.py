"""What ``memwatch run`` says on the console (stderr: the script's stdout stays its own): one line
per new verdict worth reading (every leak, whatever its severity: a slow leak is still said once;
any other finding of severity warning or critical), as the checks make them
(:class:`ConsoleSink`), one line when a later check changes a belief that was said (a leak that
stopped, that fills a bounded container, that resumed; which ranks leak), and a few lines at
exit (:func:`exit_lines`): the current verdicts, and the ones withdrawn, with their history.

Example::

    >>> from memwatch import Finding
    >>> from memwatch.autorun.console import verdict_line
    >>> f = Finding(kind="leak", metric="host.rss", severity="warning", message="grows.",
    ...             bytes_per_step=262144.0, culprit="local `kept` of train()")
    >>> verdict_line(f)
    'leak in host.rss (warning): +256.0 KiB per step; held by: local `kept` of train()'
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memwatch.analysis.beliefs import current, describe, history, state_of
from memwatch.core.findings import Finding
from memwatch.core.protocols import CheckReport
from memwatch.core.units import fmt_bytes
from memwatch.core.verdict_words import counts
from memwatch.sinks.base import NullSink

__all__ = ["ConsoleSink", "exit_lines", "say", "verdict_line", "withdrawn", "worth_saying"]

_RANK = {"critical": 0, "warning": 1, "info": 2}


def worth_saying(f: Finding) -> bool:
    """Every leak, and any finding of severity warning or critical: what counts for the run's
    verdict (:func:`memwatch.core.verdict_words.counts`)."""
    return counts(f)


def say(line: str, label: str = "") -> None:
    """One line on stderr, ``memwatch[label]: ...``; never raises."""
    say_all([line], label)


def say_all(lines: Sequence[str], label: str = "") -> None:
    """Lines on stderr, each ``memwatch[label]: ...``, in one write: the ranks of a job share
    one stderr, and a line written in two parts (``print`` writes its end apart, and
    unbuffered, as under ``PYTHONUNBUFFERED``, each part reaches the pipe on its own) was cut
    by another rank's (a write of up to 4 KiB to a pipe is never interleaved). Never
    raises."""
    try:
        sys.stderr.write("".join(f"memwatch{label}: {ln}\n" for ln in lines))
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not break the script
        pass


def verdict_line(f: Finding) -> str:
    """A finding in one line: kind, metric, severity, rate, forecast, holder."""
    text = f"{f.kind} in {f.metric} ({f.severity})"
    if f.stage != "train":
        text += f" [{f.stage} loop]"
    parts = []
    if f.bytes_per_step:
        parts.append(f"{'+' if f.bytes_per_step > 0 else ''}{fmt_bytes(f.bytes_per_step)} per "
                     "step")
    if f.steps_to_oom is not None:
        parts.append(f"out of memory in ~{f.steps_to_oom:,.0f} steps")
    if f.culprit:
        parts.append(f"held by: {f.culprit}")
    return text + (": " + "; ".join(parts) if parts else "")


class ConsoleSink(NullSink):
    """A sink that prints each new verdict worth saying (:func:`worth_saying`) once per (loop,
    kind, metric), and once more when a later check names the holder the first could not."""

    sink_name = "console"
    #: It says every new verdict on the console: the adapters give no warning or notice of
    #: their own beside its line (one line per verdict).
    tells_findings = True

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.said: set[tuple[str, str, str, bool]] = set()
        #: Beliefs whose state was said (a change of them is news).
        self.told: set[str] = set()
        #: Every finding the checks reported (the latest 1,000), for the summary at exit.
        self.findings: list[Finding] = []

    def on_check(self, report: CheckReport) -> None:
        self.findings.extend(report.findings)
        del self.findings[:-1000]
        for f in report.findings:
            where = f"check {f.check} at step {f.step}" if f.check is not None else \
                f"step {f.step}"
            change = f.evidence.get("belief_change")
            if change and f.belief in self.told:
                say(f"{where}: {change}", self.label)
                continue
            if not worth_saying(f):
                continue
            if f.belief is not None:
                self.told.add(f.belief)
            key = (f.stage, f.kind, f.metric, bool(f.culprit))
            if key in self.said or (not f.culprit and (*key[:3], True) in self.said):
                continue
            self.said.add(key)
            say(f"{where}: {verdict_line(f)}", self.label)

    # Samples are not printed; a bundle, the flight recorder says (and the summary at exit
    # names the failure's bundle): the rest of the sink is NullSink's.


def _worst_first(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (_RANK.get(f.severity, 3), f.kind, f.metric))


def withdrawn(findings: Sequence[Finding]) -> list[tuple[Finding, str]]:
    """The current beliefs that were leaks once and are not now (growth that stopped, a
    container that turned out bounded), each with its history in words."""
    out = []
    for f in current(findings):
        if f.belief is None or state_of(f) == "leak":
            continue
        changes = history(findings, f.belief)
        if any(c["state"] == "leak" for c in changes):
            out.append((f, describe(changes)))
    return out


def exit_lines(what: str, steps: int, checks: int, findings: Sequence[Finding],
               report: Path | None, bundle: Any, max_findings: int = 4,
               unit: str = "step", summary: Path | None = None) -> list[str]:
    """The summary printed when the script exits: what watched it, the current verdicts (worst
    first: one per belief, its latest state), the verdicts later checks withdrew (with their
    history), the report, ``summary.json`` and the bundle."""
    worth = [f for f in _worst_first(current(findings)) if worth_saying(f)]
    gone = withdrawn(findings)
    lines = [f"watched {what}: {steps:,} {unit}(s), {checks} check(s); "
             + (f"{len(worth)} verdict(s)" if worth else
                "no leak, no warning" if checks else
                "no check ran (no step was recorded)")
             + (f"; {len(gone)} withdrawn" if gone else "")]
    for f in worth[:max_findings]:
        changes = history(findings, f.belief) if f.belief else []
        lines.append(f"  {verdict_line(f)}"
                     + (f" ({describe(changes)})" if len(changes) > 1 else ""))
    if len(worth) > max_findings:
        lines.append(f"  ... and {len(worth) - max_findings} more (see the report)")
    for f, words in gone[:max_findings]:
        lines.append(f"  withdrawn: {f.metric}"
                     + (f" held by {f.evidence['holder']}" if f.evidence.get("holder") else "")
                     + f": {words}")
    if report is not None:
        lines.append(f"report: {report}" + (f" (and {summary.name})" if summary else ""))
    elif summary is not None:
        lines.append(f"summary: {summary}")
    if bundle is not None:
        lines.append(f"bundle of the failure: {bundle} (`memwatch inspect {bundle}`)")
    return lines
