"""The run's verdict in a few words, the same on every surface: which findings count for it, the
worst of them, and how it reads (``"warning: leak in host.rss"``; ``"ok"`` when nothing counts).

A finding counts when it threatens the run (severity warning or critical) or is a leak of any
severity (a confirmed leak that will not kill this run is still not "ok"); other informational
findings (a warm-up that levelled off) do not. The worst is the most severe, then the soonest to
run out. ``summary.json``'s ``verdict``, W&B's ``memwatch/verdict`` and ``memwatch ls`` of a
finished run all say it this way, from the run's current verdicts
(:meth:`memwatch.MemWatch.current_findings`).

Example::

    >>> from memwatch.core.findings import Finding
    >>> from memwatch.core.verdict_words import run_verdict
    >>> f = Finding(kind="leak", metric="host.rss", severity="info", message="grows.")
    >>> run_verdict([f]), run_verdict([])
    ('info: leak in host.rss, not a threat to this run', 'ok')
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from memwatch.core.findings import Finding

__all__ = ["COUNTED_KINDS", "counts", "run_verdict", "verdict_text", "worst_first"]

#: Kinds that count for the verdict whatever their severity.
COUNTED_KINDS = ("leak", "rank_leak")
_RANK = {"info": 0, "warning": 1, "critical": 2}


def _get(f: Finding | Mapping[str, Any], name: str) -> Any:
    return f.get(name) if isinstance(f, Mapping) else getattr(f, name, None)


def counts(f: Finding | Mapping[str, Any]) -> bool:
    """Does ``f`` (a finding, or its dict) count for the run's verdict."""
    return _get(f, "severity") in ("warning", "critical") or _get(f, "kind") in COUNTED_KINDS


def _soonest(f: Finding | Mapping[str, Any]) -> float:
    steps = _get(f, "steps_to_oom")
    return float(steps) if isinstance(steps, (int, float)) and math.isfinite(steps) else math.inf


def worst_first(findings: Iterable[Finding | Mapping[str, Any]]
                ) -> list[Finding | Mapping[str, Any]]:
    """The findings that count, most severe first, then the soonest to run out."""
    got = [f for f in findings if counts(f)]
    return sorted(got, key=lambda f: (-_RANK.get(str(_get(f, "severity")), 0), _soonest(f)))


def verdict_text(f: Finding | Mapping[str, Any]) -> str:
    """``"warning: leak in device.allocated"``; an evaluation loop's says so; a leak that is no
    threat says so: ``"info: leak in host.rss, not a threat to this run"``."""
    stage = _get(f, "stage") or "train"
    where = "" if stage == "train" else f" ({stage} loop)"
    sev = _get(f, "severity")
    text = f"{sev}: {_get(f, 'kind')} in {_get(f, 'metric')}{where}"
    return text + ", not a threat to this run" if sev == "info" else text


def run_verdict(findings: Iterable[Finding | Mapping[str, Any]]) -> str:
    """The run's verdict: the worst finding that counts, in words, or ``"ok"``."""
    worst = worst_first(findings)
    return verdict_text(worst[0]) if worst else "ok"
