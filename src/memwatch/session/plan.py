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

    def plan(self, total_steps: int | None = None, steps_per_epoch: int | None = None) -> None:
        """The run's planned length and its epochs' length, when the framework knows them
        (each ignored when None or already known)."""
        if self.total_steps is None and total_steps is not None:
            self.total_steps = int(total_steps)
        if self.steps_per_epoch is None and steps_per_epoch is not None:
            self.steps_per_epoch = int(steps_per_epoch)

    def defer_leaks(self, epochs_ended: bool) -> bool:
        """In the first epoch of a run planned to have more, only its end tells a leak from
        epoch-scoped accumulation: checks inside it leave those verdicts to the epoch end."""
        spe, total = self.steps_per_epoch, self.total_steps
        if not spe or epochs_ended:
            return False
        return total is None or total > 1.5 * spe
