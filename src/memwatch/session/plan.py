"""What a session knows of the run's length (:class:`RunPlan`): the optimizer steps it plans
and the length of its epochs, from the options or from the framework, and what follows for the
checks inside the first epoch."""

from __future__ import annotations

__all__ = ["RunPlan"]


class RunPlan:
    """The run's planned length (the forecast's horizon) and its epochs' length.

    Each is the option given, else the first the framework tells (``MemWatch.plan_run``).

    Example::

        >>> plan = RunPlan(total_steps=None, steps_per_epoch=None)
        >>> plan.plan(total_steps=1000, steps_per_epoch=100)
        >>> plan.plan(total_steps=5)  # the first planned length is kept
        >>> plan.total_steps, plan.defer_leaks(epochs_ended=False)
        (1000, True)
    """

    def __init__(self, total_steps: int | None, steps_per_epoch: int | None) -> None:
        #: The run's planned number of optimizer steps, when known.
        self.total_steps = total_steps
        #: The epoch length, when known.
        self.steps_per_epoch = steps_per_epoch
        #: Whether the loop has epochs: None (unknown until one ends), False (it has none:
        #: ``memwatch run``'s plain loop, ``mw.plan_run(epochs=False)``).
        self.epochs: bool | None = None

    def plan(self, total_steps: int | None = None, steps_per_epoch: int | None = None,
             epochs: bool | None = None) -> None:
        """The run's planned length and its epochs' length, when the framework knows them
        (each ignored when None or already known), and whether it has epochs at all."""
        if self.total_steps is None and total_steps is not None:
            self.total_steps = int(total_steps)
        if self.steps_per_epoch is None and steps_per_epoch is not None:
            self.steps_per_epoch = int(steps_per_epoch)
        if epochs is not None:
            self.epochs = bool(epochs)

    def defer_leaks(self, epochs_ended: bool, early: bool = False) -> bool:
        """In the first epoch of a run planned to have more, only its end tells a leak from
        epoch-scoped accumulation: checks inside it leave those verdicts to the epoch end.
        ``early``: a check sized to the run before its cap (steps 100 ... 3,200 of
        ``check_every_n_steps="auto"``); where nobody said whether the loop has epochs, such
        a check leaves leak verdicts to the first epoch end, the cap's check or the last word
        (a plain loop's epoch of a few hundred steps that gathers outputs and lets them go at
        its end would otherwise read as a leak at the checks of steps 200 and 400)."""
        spe, total = self.steps_per_epoch, self.total_steps
        if epochs_ended:
            return False
        if not spe:
            return early and self.epochs is None
        return total is None or total > 1.5 * spe
