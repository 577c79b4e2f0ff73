"""The verdicts a run holds now: the latest finding of each thing it judged.

The analyzer restates a verdict at every check (a leak's rate and forecast are news each time),
so the findings so far hold many of one leak. What a surface shows as the run's *current*
verdicts (``summary.json``, the summary at exit, the report's cards, W&B's
``memwatch/verdict``, ``memwatch ls``/``inspect`` of a finished run) is one per (metric, kind,
holder): the latest. A verdict that named no holder yet is replaced by a later one of the same
metric and kind that names it (the census needs two checks).

:meth:`memwatch.MemWatch.current_findings` is the one accessor every surface reads.

Example::

    >>> from memwatch import Finding
    >>> from memwatch.session.current import current_findings
    >>> a = Finding(kind="leak", metric="host.rss", severity="info", message="grows.")
    >>> b = Finding(kind="leak", metric="host.rss", severity="warning", message="grows.",
    ...             evidence={"holder": "train.cache"})
    >>> [f.severity for f in current_findings([a, b, b])]
    ['warning']
"""

from __future__ import annotations

from collections.abc import Iterable

from memwatch.core.findings import Finding

__all__ = ["current_findings"]


def _holder(f: Finding) -> str | None:
    h = f.evidence.get("holder")
    return str(h) if h else None


def current_findings(findings: Iterable[Finding]) -> list[Finding]:
    """The latest finding per (metric, kind, holder), in the order they were last said."""
    latest: dict[tuple[str, str, str | None], Finding] = {}
    for f in findings:
        holder = _holder(f)
        key = (f.metric, f.kind, holder)
        latest.pop(key, None)
        if holder is not None:
            latest.pop((f.metric, f.kind, None), None)  # the holder is named now
        latest[key] = f
    return list(latest.values())
