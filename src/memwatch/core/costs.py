"""What memwatch's own work off the hot path costs a run, by part, and the one budget it keeps.

Every part that runs beside training adds the time it took here: the checks (censuses, holder
walks, the rest of the verdicts), the background reads (USS/PSS, workers, the cgroup, the C
allocator), the black-box rewrites, the sinks. ``MemWatch.costs()`` shows them; the budget
(:meth:`Costs.allows`) decides the work that is optional: a census the series only hints at,
background reads more often than their cost allows.

The budget is a share of the run so far: at defaults, memwatch's work off the hot path stays
under 1% of the run's wall time. Decisions use measured cost *per unit of work* (a census's
seconds per object walked, a background pass's CPU seconds) against the run's own pace, never
how long the last check happened to take on a busy machine: a machine twice as loaded makes the
run and memwatch's work twice as slow alike, and the same decisions follow.

Example::

    >>> from memwatch.core.costs import Costs
    >>> c = Costs(budget=0.01, now=lambda: 100.0, start=0.0)
    >>> c.add("census", 0.4)
    >>> c.allows(0.5), c.allows(0.7)
    (True, False)
    >>> round(c.seconds["census"], 2), c.spent()
    (0.4, 0.4)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["BUDGET", "Costs"]

#: The share of a run's wall time memwatch's work off the hot path may take, at defaults.
BUDGET = 0.01


class Costs:
    """Seconds spent by part, and the budget left for optional work."""

    def __init__(self, budget: float = BUDGET, now: Callable[[], float] = time.monotonic,
                 start: float | None = None) -> None:
        self.budget = budget
        self._now = now
        self.start = now() if start is None else start
        #: Seconds by part (``census``, ``attribution``, ``checks``, ``background``, ...). Each
        #: part is written by one thread only.
        self.seconds: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + max(seconds, 0.0)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t0)

    def spent(self) -> float:
        return sum(self.seconds.values())

    def elapsed(self) -> float:
        """Seconds since the session started."""
        return max(self._now() - self.start, 0.0)

    def allows(self, seconds: float) -> bool:
        """Optional work of this estimated cost keeps everything within the budget."""
        return self.spent() + seconds <= self.budget * self.elapsed()

    def snapshot(self) -> dict[str, float]:
        """Seconds by part, plus ``total`` and the run's ``elapsed`` wall time."""
        out = dict(self.seconds)
        out["total"] = self.spent()
        out["elapsed"] = self.elapsed()
        return out
