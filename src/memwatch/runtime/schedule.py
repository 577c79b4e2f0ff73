"""Work that runs every N optimizer steps, behind one integer comparison per step.

``MemWatch.step()`` compares its step count with :attr:`Schedule.next_due` and calls
:meth:`Schedule.run` only when something is due: the sinks' samples, the watchdog and the flight
recorder's housekeeping, the checks inside long epochs. One counter for all of them, so they
cannot drift apart.

Example::

    >>> from memwatch.runtime.schedule import Schedule
    >>> ran = []
    >>> s = Schedule()
    >>> s.add("log", 4, lambda step: ran.append(("log", step)), step=0, aligned=True)
    >>> s.add("watch", 3, lambda step: ran.append(("watch", step)), step=0)
    >>> for step in range(1, 9):
    ...     if step >= s.next_due:
    ...         s.run(step)
    >>> ran
    [('watch', 3), ('log', 4), ('watch', 6), ('log', 8)]
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

__all__ = ["Schedule"]

_NEVER = sys.maxsize


@dataclasses.dataclass
class _Task:
    name: str
    every: int
    fn: Callable[[int], None]
    aligned: bool  # due at multiples of `every` (the logged steps stay aligned across a resume)
    due: int = _NEVER


class Schedule:
    """Periodic tasks keyed to the optimizer step."""

    def __init__(self) -> None:
        self._tasks: list[_Task] = []
        #: The smallest step at which some task is due (``sys.maxsize``: none).
        self.next_due = _NEVER

    def add(self, name: str, every: int, fn: Callable[[int], None], step: int,
            aligned: bool = False) -> None:
        """Run ``fn(step)`` every ``every`` steps from ``step`` on (replaces a task of that
        name)."""
        self._tasks = [t for t in self._tasks if t.name != name]
        task = _Task(name, max(int(every), 1), fn, aligned)
        self._tasks.append(task)
        self._plan(task, step)
        self._refresh()

    def remove(self, name: str) -> None:
        self._tasks = [t for t in self._tasks if t.name != name]
        self._refresh()

    def restart(self, name: str, step: int) -> None:
        """Plan the task ``name`` (if any) from ``step``: its period counts from now."""
        for t in self._tasks:
            if t.name == name:
                self._plan(t, step)
        self._refresh()

    def reschedule(self, step: int) -> None:
        """Plan every task from ``step`` (after the step count jumped: a resumed run)."""
        for t in self._tasks:
            self._plan(t, step)
        self._refresh()

    def clear(self) -> None:
        self._tasks = []
        self.next_due = _NEVER

    def run(self, step: int) -> None:
        """Run the tasks due at ``step``, in the order they were added. A task's exception
        propagates (after the others' schedule is kept): the caller owns the failure rule."""
        due = [t for t in self._tasks if step >= t.due]
        for t in due:
            self._plan(t, step)
        self._refresh()
        for t in due:
            # An aligned task only fires on its multiples (not after a jump past one).
            if not t.aligned or step % t.every == 0:
                t.fn(step)

    def _plan(self, t: _Task, step: int) -> None:
        t.due = (step // t.every + 1) * t.every if t.aligned else step + t.every

    def _refresh(self) -> None:
        self.next_due = min((t.due for t in self._tasks), default=_NEVER)
