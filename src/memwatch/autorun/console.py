"""What ``memwatch run`` says on the console (stderr: the script's stdout stays its own): one line
per new verdict worth reading (every leak, whatever its severity: a slow leak is still said once;
any other finding of severity warning or critical), as the checks make them
(:class:`ConsoleSink`), and a few lines at exit (:func:`exit_lines`).

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

from memwatch.core.findings import Finding
from memwatch.core.protocols import CheckReport
from memwatch.core.units import fmt_bytes
from memwatch.runtime.warn import WARN_SEVERITIES
from memwatch.sinks.base import NullSink

__all__ = ["ConsoleSink", "exit_lines", "say", "verdict_line", "worth_saying"]

_RANK = {"critical": 0, "warning": 1, "info": 2}
#: Kinds said whatever their severity (an ``info`` leak is one that cannot kill this run).
_ALWAYS = ("leak", "rank_leak")


def worth_saying(f: Finding) -> bool:
    """Every leak, and any finding of severity warning or critical."""
    return f.kind in _ALWAYS or f.severity in WARN_SEVERITIES


def say(line: str, label: str = "") -> None:
    """One line on stderr, ``memwatch[label]: ...``; never raises."""
    try:
        print(f"memwatch{label}: {line}", file=sys.stderr, flush=True)
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

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.said: set[tuple[str, str, str, bool]] = set()
        #: Every finding the checks reported (the latest 1,000), for the summary at exit.
        self.findings: list[Finding] = []

    def on_check(self, report: CheckReport) -> None:
        self.findings.extend(report.findings)
        del self.findings[:-1000]
        for f in report.findings:
            if not worth_saying(f):
                continue
            key = (f.stage, f.kind, f.metric, bool(f.culprit))
            if key in self.said or (not f.culprit and (*key[:3], True) in self.said):
                continue
            self.said.add(key)
            where = f"check {f.check} at step {f.step}" if f.check is not None else \
                f"step {f.step}"
            say(f"{where}: {verdict_line(f)}", self.label)

    # Samples are not printed; a bundle, the flight recorder says (and the summary at exit
    # names the failure's bundle): the rest of the sink is NullSink's.


def _latest_per_metric(findings: Iterable[Finding]) -> list[Finding]:
    latest: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        latest[(f.stage, f.kind, f.metric)] = f
    return sorted(latest.values(), key=lambda f: (_RANK.get(f.severity, 3), f.kind, f.metric))


def exit_lines(what: str, steps: int, checks: int, findings: Sequence[Finding],
               report: Path | None, bundle: Any, max_findings: int = 4,
               unit: str = "step") -> list[str]:
    """The summary printed when the script exits: what watched it, the verdicts (worst first,
    the latest of each), the report and the bundle."""
    worth = [f for f in _latest_per_metric(findings) if worth_saying(f)]
    lines = [f"watched {what}: {steps:,} {unit}(s), {checks} check(s); "
             + (f"{len(worth)} verdict(s)" if worth else
                "no leak, no warning" if checks else
                "no check ran (fewer steps than --check-every-n-steps, shorter than "
                "--check-every-s)")]
    lines += [f"  {verdict_line(f)}" for f in worth[:max_findings]]
    if len(worth) > max_findings:
        lines.append(f"  ... and {len(worth) - max_findings} more (see the report)")
    if report is not None:
        lines.append(f"report: {report}")
    if bundle is not None:
        lines.append(f"bundle of the failure: {bundle} (`memwatch inspect {bundle}`)")
    return lines
