"""When checks come in a run whose length nobody told (``check_every_n_steps="auto"``, the
default): early enough to judge a short run, further apart as it grows.

A run of 1,200 steps checked every 5,000 steps is never judged; a run of 200,000 steps checked
every 100 pays for 2,000 checks. With no length known (a plain loop, a script with no epochs,
``memwatch run`` on a loop it cannot see the end of), :class:`SizedChecks` puts the checks at
steps ``100, 200, 400, 800, 1,600, 3,200`` (each interval twice the previous one) and then at
every multiple of the cap (``5,000``: the fixed cadence every run had before). A leak is
confirmed at the second check after it starts, so a run is judged once it has lived about
twice as long as its leak: the 1,200-step loop at steps 400 and 800, a 100,000-step run at the
same 5,000-step checks as before plus the six early ones.

A **floor in CPU seconds** keeps those early checks from costing more than the work they judge:
one before the cap is due only once the process has run, since the previous check ended,
:data:`COST_RATIO` times the CPU that check took, and at least :data:`FLOOR_CPU_S` (a check
that finds nothing costs 2-5 ms of CPU; one with a census of a framework's heap 0.1-0.4 s:
``benchmarks/bench_check_cadence.py``). So the early checks take at most about a twentieth of
the work they judge, a loop of microsecond steps gets its first check when its work, not its
step count, is worth judging, and a long run pays for a check or two more than the fixed
cadence, not six. The checks at the cap's multiples keep the fixed cadence (no floor). CPU
time, never wall time: a busy machine stretches the wall clock, not the work. Where ranks
exchange summaries at checks (every rank must check at the same step) there is no floor: steps
alone decide.

Once an epoch has ended the run has told its rhythm: checks come at epoch ends, and inside long
epochs at the cap's multiples only.

Example::

    >>> from memwatch.session.cadence import SizedChecks
    >>> c = SizedChecks(cap=5000, floor_s=0.0)
    >>> due, steps = 0, []
    >>> while len(steps) < 9:
    ...     due = c.due_after(due)
    ...     steps.append(due)
    >>> steps
    [100, 200, 400, 800, 1600, 3200, 5000, 10000, 15000]
    >>> c.epoch_ended()
    >>> c.due_after(150)  # epochs give the rhythm now: the cap's multiples
    5000
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["COST_RATIO", "FIRST_CHECK_STEPS", "FLOOR_CPU_S", "SizedChecks", "check_steps"]

#: The first check's step: a hundred steps are enough points for the trend tests (a check needs
#: at least 16) and come within a few seconds of any loop.
FIRST_CHECK_STEPS = 100
#: CPU seconds the process runs between two sized checks, at least: twenty times what a check
#: that finds nothing costs (2-5 ms), so such checks take at most ~5% of the work they judge.
FLOOR_CPU_S = 0.1
#: ... and at least this many times the CPU the previous check took (one with a census costs
#: 0.1-0.4 s): an early check takes at most about a twentieth of the work it judges.
COST_RATIO = 20.0


class SizedChecks:
    """The steps at which checks are due while the run's length is unknown (see the module doc).

    Args:
        cap: the longest interval, in optimizer steps (``5000``): from there on, checks at its
            multiples.
        first: the first check's step.
        floor_s: CPU seconds of the process between checks (0: none; ``None`` where ranks
            exchange summaries, which must check at the same step).
        cpu: the CPU clock (``time.process_time``; tests pass their own).
    """

    def __init__(self, cap: int, first: int = FIRST_CHECK_STEPS,
                 floor_s: float | None = FLOOR_CPU_S,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.cap = max(int(cap), 1)
        self.first = max(min(int(first), self.cap), 1)
        self.floor_s = floor_s or 0.0
        self._cpu = cpu
        self._mark = cpu() if self.floor_s else 0.0
        self._began: float | None = None  # the CPU clock when the check now running began
        self._wait = self.floor_s  # CPU seconds the next early check waits for
        self._epochs = False

    def due_after(self, step: int) -> int:
        """The step at which the next check is due after one at ``step`` (0: the start)."""
        if not self._epochs:
            due = self.first
            while due <= step and due < self.cap:
                due *= 2
            if step < due < self.cap:
                return due
        return (step // self.cap + 1) * self.cap

    def ready(self, due: int | None = None) -> bool:
        """The CPU floor is met for a check due at step ``due``: the process ran ``floor_s`` of
        CPU since the last check, and :data:`COST_RATIO` times what that check took (a check at
        the cap's multiples has no floor)."""
        if not self.floor_s or (due is not None and due % self.cap == 0):
            return True
        now = self._cpu()
        if now - self._mark < self._wait:
            return False
        self._began = now
        return True

    def recheck(self, step: int, due: int) -> int:
        """A check due at ``due`` waits for the floor: the step at which to ask again (an
        eighth of the way on, or the cap's next multiple, which never waits)."""
        return min(step + max(16, due // 8), (step // self.cap + 1) * self.cap)

    def checked(self) -> None:
        """A check just ended: the floor counts from now, and is what it took times
        :data:`COST_RATIO`."""
        if self.floor_s:
            self._mark = self._cpu()
            took = self._mark - self._began if self._began is not None else 0.0
            self._wait = max(self.floor_s, COST_RATIO * max(took, 0.0))
            self._began = None

    def epoch_ended(self) -> None:
        """An epoch ended: from now on only the cap's multiples (epoch ends are checks)."""
        self._epochs = True


def check_steps(every_n: int | str | None, cap: int, exchange: bool,
                epochs_ended: bool) -> int | SizedChecks | None:
    """``check_every_n_steps`` as the scheduler takes it: a number of steps as given, ``None``
    as given, ``"auto"`` as :class:`SizedChecks` capped at ``cap`` (no CPU floor when ranks
    ``exchange`` summaries: they must check at one step; the cap's multiples only once an epoch
    has ended)."""
    if every_n != "auto":
        return every_n if isinstance(every_n, int) else None
    sized = SizedChecks(cap, floor_s=None if exchange else FLOOR_CPU_S)
    if epochs_ended:
        sized.epoch_ended()
    return sized
