"""When a session's periodic work runs: every N optimizer steps (the sinks' samples, the watchdog
and the flight recorder's housekeeping, checks inside long epochs), at steps sized to the run
(checks while its length is unknown: :class:`memwatch.session.cadence.SizedChecks`) and every T
seconds (checks by time). One object owns both clocks, so ``step()`` asks one question behind
two comparisons: is anything due?

Example::

    >>> from memwatch.session.scheduler import Scheduler
    >>> ran = []
    >>> s = Scheduler()
    >>> s.every_steps("log", 4, lambda step: ran.append(("log", step)), step=0, aligned=True)
    >>> s.checks(every_n=3, every_s=None, by_steps=lambda step: ran.append(("check", step)),
    ...          by_time=lambda step: ran.append(("timed", step)), step=0, now=0.0)
    >>> for step in range(1, 9):
    ...     if step >= s.next_due or step >= s.due_t:
    ...         s.run(step, now=float(step))
    >>> ran
    [('check', 3), ('log', 4), ('check', 6), ('log', 8)]
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable

from memwatch.session.cadence import SizedChecks

__all__ = ["Scheduler"]

_NEVER = sys.maxsize
_CHECK = "check"


@dataclasses.dataclass
class _Task:
    name: str
    every: int
    fn: Callable[[int], None]
    aligned: bool  # due at multiples of `every` (the logged steps stay aligned across a resume)
    due: int = _NEVER
    sized: SizedChecks | None = None  # checks sized to the run: its steps, its CPU floor


class Scheduler:
    """Step- and time-based periodic work of one session.

    Attributes:
        next_due: the smallest optimizer step at which some step task is due
            (``sys.maxsize``: none).
        due_t: the monotonic time at which a check by time is due (``inf``: none).
    """

    def __init__(self) -> None:
        self._tasks: list[_Task] = []
        self.next_due = _NEVER
        self.due_t = math.inf
        self._every_s: float | None = None
        self._by_time: Callable[[int], None] | None = None

    def every_steps(self, name: str, every: int, fn: Callable[[int], None], step: int,
                    aligned: bool = False) -> None:
        """Run ``fn(step)`` every ``every`` optimizer steps from ``step`` on (``aligned``: at
        multiples of ``every``, so logged steps line up across a resume); replaces a task of
        that name."""
        self._tasks = [t for t in self._tasks if t.name != name]
        task = _Task(name, max(int(every), 1), fn, aligned)
        self._tasks.append(task)
        self._plan(task, step)
        self._refresh()

    def checks(self, every_n: int | SizedChecks | None, every_s: float | None,
               by_steps: Callable[[int], None], by_time: Callable[[int], None], step: int,
               now: float) -> None:
        """Checks every ``every_n`` steps (``by_steps(step)``; a :class:`SizedChecks`: at the
        steps it sizes to the run) and/or every ``every_s`` seconds (``by_time(step)``),
        whichever comes first; after any check both count from then on."""
        self._by_time = by_time
        self._every_s = every_s
        if isinstance(every_n, SizedChecks):
            self._tasks = [t for t in self._tasks if t.name != _CHECK]
            task = _Task(_CHECK, every_n.cap, by_steps, False, sized=every_n)
            self._tasks.append(task)
            self._plan(task, step)
            self._refresh()
        elif every_n is not None:
            self.every_steps(_CHECK, every_n, by_steps, step)
        else:
            self._tasks = [t for t in self._tasks if t.name != _CHECK]
            self._refresh()
        self.due_t = now + every_s if every_s is not None else math.inf

    def run(self, step: int, now: float) -> None:
        """Run what is due at ``step`` and time ``now``: the step tasks in the order they were
        added, then a check by time. A task's exception propagates (the session owns the
        failure rule); the schedule is kept either way."""
        due = [t for t in self._tasks if step >= t.due]
        waiting = {id(t) for t in due if t.sized is not None and not t.sized.ready(t.due)}
        for t in due:
            if id(t) in waiting:
                assert t.sized is not None
                t.due = t.sized.recheck(step, t.due)  # the CPU floor is not met yet
            else:
                self._plan(t, step)
        self._refresh()
        try:
            for t in due:
                # An aligned task only fires on its multiples (not after a jump past one).
                if id(t) not in waiting and (not t.aligned or step % t.every == 0):
                    t.fn(step)
            if now >= self.due_t and self._by_time is not None:
                # (a step-based check just now pushed the time-based one back)
                self._by_time(step)
        finally:
            self._refresh()

    def checked(self, step: int, now: float, epoch_end: bool = False) -> None:
        """A check ran (at an epoch end, by steps or by time): the next one is due
        ``every_n`` steps (or the next sized step) and ``every_s`` seconds from now. After an
        epoch end, checks sized to the run keep to the cap's multiples (epochs give the
        rhythm)."""
        for t in self._tasks:
            if t.name == _CHECK:
                if t.sized is not None:
                    if epoch_end:
                        t.sized.epoch_ended()
                    t.sized.checked()
                self._plan(t, step)
        self._refresh()
        self.due_t = now + self._every_s if self._every_s is not None else math.inf

    def reschedule(self, step: int) -> None:
        """Plan every step task from ``step`` (after the step count jumped: a resumed run)."""
        for t in self._tasks:
            self._plan(t, step)
        self._refresh()

    def clear(self) -> None:
        """Nothing is due any more (a closed session)."""
        self._tasks = []
        self._by_time = None
        self.next_due = _NEVER
        self.due_t = math.inf

    def _plan(self, t: _Task, step: int) -> None:
        if t.sized is not None:
            t.due = t.sized.due_after(step)
        else:
            t.due = (step // t.every + 1) * t.every if t.aligned else step + t.every

    def _refresh(self) -> None:
        self.next_due = min((t.due for t in self._tasks), default=_NEVER)
