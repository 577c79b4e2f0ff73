"""What memwatch's own work off the hot path costs a run, by part, and the one budget it keeps.

Every part that runs beside training adds the time it took here: the checks (censuses, holder
walks, the rest of the verdicts), the background reads (USS/PSS, workers, the cgroup, the C
allocator), the black-box rewrites, the sinks. ``MemWatch.costs()`` shows them; the budget
(:meth:`Costs.allows`) decides the work that is optional: a census the series only hints at,
background reads more often than their cost allows.

The budget is a share of the run so far: at defaults, memwatch's work off the hot path stays
under 1% of the run. Decisions are taken in **CPU time** once the training thread is known
(:meth:`Costs.bind`): memwatch's own CPU seconds (a census's, a background pass's) against the
CPU seconds the training thread has run since. Wall time is what a shared machine's load
stretches, and not evenly: a census that meets a busy moment takes twice its wall time, the run
around it does not, and a budget in wall time then decides differently from one run to the next
(the corpus's hint censuses did). CPU time is the work itself. Before the thread is bound, or
where a thread's CPU clock cannot be read, wall time stands in. ``seconds`` (what
``MemWatch.costs()`` shows) stays in wall time: what the run waited.

Example::

    >>> from memwatch.core.costs import Costs
    >>> c = Costs(budget=0.01, now=lambda: 100.0, start=0.0, floor_s=0.0)
    >>> c.add("census", 0.4)
    >>> c.allows(0.5), c.allows(0.7)
    (True, False)
    >>> round(c.seconds["census"], 2), c.spent()
    (0.4, 0.4)
    >>> b = Costs(budget=0.01, now=lambda: 100.0, start=0.0, floor_s=0.0)
    >>> cpu = iter([0.0, 10.0, 10.0])  # the training thread's CPU clock: at bind, then later
    >>> b.bind(clock=lambda: next(cpu))
    >>> b.add("census", 0.4, cpu=0.05)  # 0.4 s of wall on a busy machine, 0.05 s of work
    >>> b.allows(0.04), b.allows(0.06)  # 1% of 10 CPU seconds, whatever the wall clock says
    (True, False)
    >>> Costs(now=lambda: 3.0, start=0.0).allows(0.2)  # a 3-second run: 1% of it is 30 ms
    False
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["BUDGET", "Costs"]

#: The share of a run's wall time memwatch's work off the hot path may take, at defaults.
BUDGET = 0.01
#: CPU seconds of optional work a run may always take, however short it is. No floor by default:
#: the only optional work left is a hint census after the run's baseline (the baseline itself
#: is always taken), and a floor put short runs right at its edge. A quarter second (the floor
#: until 2026-11-28) was, with a census of a framework's heap at 0.1-0.15 CPU s, what a clean
#: 12-s fit had spent when its second hint came: one run in three took a second census (+2% of
#: the fit), decided by how far the caches it shares with its data-loading workers slowed the
#: first. Without a floor a run takes one only once 1% of its training CPU time covers it
#: (about 30 s of training on such a heap), far from any short run.
FLOOR_S = 0.0


class Costs:
    """Seconds spent by part, and the budget left for optional work."""

    def __init__(self, budget: float = BUDGET, now: Callable[[], float] = time.monotonic,
                 start: float | None = None, floor_s: float = FLOOR_S) -> None:
        self.budget = budget
        self.floor_s = floor_s
        self._now = now
        self.start = now() if start is None else start
        #: Wall seconds by part (``census``, ``attribution``, ``checks``, ``background``, ...).
        #: Each part is written by one thread only.
        self.seconds: dict[str, float] = {}
        #: CPU seconds by part, of the thread that did the work: what decisions count.
        self.cpu: dict[str, float] = {}
        self._clock: Callable[[], float] | None = None  # the training thread's CPU clock
        self._clock_start = 0.0

    def bind(self, thread_id: int | None = None,
             clock: Callable[[], float] | None = None) -> None:
        """Budget in CPU time from now on: against the CPU seconds of the thread ``thread_id``
        (the one that trains; default: the calling thread) since this call. ``clock`` replaces
        that thread's CPU clock (tests). Where the platform cannot read another thread's CPU
        clock, wall time stays."""
        if clock is None:
            get = getattr(time, "pthread_getcpuclockid", None)
            if get is None:
                return
            try:
                clk = get(threading.get_ident() if thread_id is None else thread_id)
                time.clock_gettime(clk)
            except (OSError, OverflowError, ValueError):
                return

            def clock() -> float:
                return time.clock_gettime(clk)

        try:
            self._clock_start = clock()
        except OSError:
            return
        self._clock = clock

    def add(self, part: str, seconds: float, cpu: float | None = None) -> None:
        """Add ``seconds`` of wall time to ``part``, and ``cpu`` seconds of CPU (default: the
        same figure: a part measured in CPU time already, as the background reads are)."""
        self.seconds[part] = self.seconds.get(part, 0.0) + max(seconds, 0.0)
        c = seconds if cpu is None else cpu
        self.cpu[part] = self.cpu.get(part, 0.0) + max(c, 0.0)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - t0, time.thread_time() - c0)

    def spent(self) -> float:
        return sum(self.seconds.values())

    def elapsed(self) -> float:
        """Seconds since the session started."""
        return max(self._now() - self.start, 0.0)

    def allows(self, seconds: float) -> bool:
        """Optional work of this estimated cost keeps everything within the budget: in CPU
        seconds against the training thread's CPU time once :meth:`bind` was called, else in
        wall seconds against the session's wall time; never less than ``floor_s`` in all."""
        clock = self._clock
        if clock is not None:
            try:
                ran = clock() - self._clock_start
            except OSError:  # the thread has ended: its clock is gone
                ran = None
            if ran is not None:
                return sum(self.cpu.values()) + seconds <= max(self.budget * max(ran, 0.0),
                                                              self.floor_s)
        return self.spent() + seconds <= max(self.budget * self.elapsed(), self.floor_s)

    def snapshot(self) -> dict[str, float]:
        """Seconds memwatch's own work off the hot path took so far, by part (``census``,
        ``attribution``, ``verdicts``, ``tracemalloc``, ``background reads``, ``slow refresh``
        (the slow reads a unit starts with, at its first step), ``black box``, ``sinks``,
        ``start``), with their ``total`` and the run's ``elapsed`` wall time since ``start()``.
        Background parts are the sampler thread's CPU time; the others the training thread's
        wall time. The optional part of that work (a census the series only hints at,
        background passes more often than their cost allows) stays within 1% of the run: see
        ``docs/benchmarks.md``."""
        out = dict(self.seconds)
        out["total"] = self.spent()
        out["elapsed"] = self.elapsed()
        return out
