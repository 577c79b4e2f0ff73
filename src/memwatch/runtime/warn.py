"""Warnings about findings: a :class:`memwatch.MemWatchWarning` once per (stage, kind, metric).

Used by the session for the findings of checks inside epochs (which ``step()`` cannot return)
and by the framework adapters for every finding of severity warning or critical.

Example::

    >>> import warnings
    >>> from memwatch import Finding
    >>> from memwatch.runtime.warn import FindingWarner
    >>> w = FindingWarner()
    >>> f = Finding(kind="leak", metric="host.rss", severity="warning", message="grows.")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     w.warn(f)
    ...     w.warn(f)  # said already
    >>> [str(c.message) for c in caught]
    ['memwatch: leak in host.rss: grows.']
"""

from __future__ import annotations

import warnings

from memwatch.core.errors import MemWatchWarning
from memwatch.core.findings import Finding

__all__ = ["WARN_SEVERITIES", "FindingWarner"]

#: Findings at these severities are warned about; ``info`` ones are only logged and kept.
WARN_SEVERITIES = ("warning", "critical")


class FindingWarner:
    """A :class:`memwatch.MemWatchWarning` once per (stage, kind, metric), and once more when a
    later verdict names the holder the first could not (the census needs two checks)."""

    def __init__(self) -> None:
        #: (stage, kind, metric) already warned about; checkpointable as a list of lists.
        self.warned: set[tuple[str, str, str]] = set()

    def warn(self, f: Finding, labels: str = "", stacklevel: int = 2) -> None:
        key = (f.stage, f.kind, f.metric)
        named = (f.stage, f.kind, f.metric + "#culprit")
        if key in self.warned and (not f.culprit or named in self.warned):
            return
        self.warned.add(key)
        if f.culprit:
            self.warned.add(named)
        text = f"memwatch{labels}: {f.kind} in {f.metric}: {f.message}"
        if f.culprit and f.culprit not in text:
            text += f" Held by: {f.culprit}."
        if f.suggestions:
            text += " Try: " + "; ".join(f.suggestions)
        warnings.warn(text, MemWatchWarning, stacklevel=stacklevel + 1)
