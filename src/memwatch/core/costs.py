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
where a thread's CPU clock cannot be read, the process's CPU time stands in (never wall time);
once the bound thread has ended, its last reading does. ``seconds`` (what ``MemWatch.costs()``
shows) stays in wall time: what the run waited.

The work counted against the budget is the work a run's *steps* cause (checks, censuses, holder
walks, the slow refresh at a unit's first step, the sinks), not the background passes and
black-box rewrites (:data:`WALL_PACED`): those come every so many wall seconds, so a run that a
busy machine stretches to twice its wall time has twice as many, and counting them would leave
a loaded run less budget for the same census (the background keeps to its own share of a core,
``timeline.sampler.PACED_SHARE``).

Example::

    >>> from memwatch.core.costs import Costs
    >>> cpu_s = [0.0]  # the process's CPU clock (injected): 100 s of work later
    >>> c = Costs(budget=0.01, now=lambda: 100.0, start=0.0, cpu_now=lambda: cpu_s[0])
    >>> cpu_s[0] = 100.0
    >>> c.add("census", 0.4)
    >>> c.allows(0.5), c.allows(0.7)
    (True, False)
    >>> round(c.seconds["census"], 2), c.spent()
    (0.4, 0.4)
    >>> b = Costs(budget=0.01, now=lambda: 100.0, start=0.0, floor_s=0.0)
    >>> cpu = iter([0.0, 10.0, 10.0, 10.0])  # the training thread's CPU clock: at bind, then
    >>> b.bind(clock=lambda: next(cpu))
    >>> b.add("census", 0.4, cpu=0.05)  # 0.4 s of wall on a busy machine, 0.05 s of work
    >>> b.allows(0.04), b.allows(0.06)  # 1% of 10 CPU seconds, whatever the wall clock says
    (True, False)
    >>> b.add("background reads", 9.0)  # passes by the wall clock: not the steps' work
    >>> b.allows(0.04)
    True
    >>> Costs(cpu_now=lambda: 3.0).allows(0.2)  # not bound: 1% of the process's 3 CPU s
    False
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["BUDGET", "WALL_PACED", "Costs"]

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
#: Parts that run every so many wall seconds (the background sampler's passes and the black
#: box it rewrites): shown by ``MemWatch.costs()``, not counted against the budget.
WALL_PACED = frozenset({"background reads", "black box"})


class Costs:
    """Seconds spent by part, and the budget left for optional work."""

    def __init__(self, budget: float = BUDGET, now: Callable[[], float] = time.monotonic,
                 start: float | None = None, floor_s: float = FLOOR_S,
                 cpu_now: Callable[[], float] = time.process_time) -> None:
        self.budget = budget
        self.floor_s = floor_s
        self._now = now
        self.start = now() if start is None else start
        self._cpu_now = cpu_now  # the process's CPU clock: the budget's base before bind()
        self._cpu_start = cpu_now()
        #: Wall seconds by part (``census``, ``attribution``, ``checks``, ``background``, ...).
        #: Each part is written by one thread only.
        self.seconds: dict[str, float] = {}
        #: CPU seconds by part, of the thread that did the work: what decisions count.
        self.cpu: dict[str, float] = {}
        self._clock: Callable[[], float] | None = None  # the training thread's CPU clock
        self._clock_start = 0.0
        self._ran = 0.0  # its last reading since bind(): kept once the thread has ended

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
        """Optional work of this estimated CPU cost keeps the steps' work (every part but
        :data:`WALL_PACED`) within the budget: against the training thread's CPU seconds since
        :meth:`bind` (its last reading once it has ended), else against the process's CPU
        seconds since this object was made; never less than ``floor_s`` in all."""
        clock = self._clock
        if clock is not None:
            try:
                self._ran = max(clock() - self._clock_start, 0.0)
            except OSError:  # the thread has ended: its clock is gone, its last reading stays
                pass
            ran = self._ran
        else:
            ran = max(self._cpu_now() - self._cpu_start, 0.0)
        spent = sum(v for k, v in self.cpu.items() if k not in WALL_PACED)
        return spent + seconds <= max(self.budget * ran, self.floor_s)

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
