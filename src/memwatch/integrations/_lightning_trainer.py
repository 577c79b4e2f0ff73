"""What the Lightning callback reads of a ``Trainer`` (duck-typed: nothing here imports Lightning,
and the ``lightning`` and ``pytorch_lightning`` trainers read the same): the device it trains on,
the optimizer steps it plans, an epoch's length, the step its loggers log at, whether a
validation ends a training epoch."""

from __future__ import annotations

from typing import Any

__all__ = ["epoch_end_follows", "epoch_steps", "logger_step", "planned_steps", "root_device"]


def root_device(trainer: Any) -> Any:
    try:
        return trainer.strategy.root_device
    except Exception:  # noqa: BLE001
        return "cpu"


def planned_steps(trainer: Any) -> int | float | None:
    """``max_steps`` when set, else Lightning's estimate of the run's optimizer steps."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        return float(trainer.estimated_stepping_batches)
    except Exception:  # noqa: BLE001 - the forecast horizon is optional
        return None


def epoch_steps(trainer: Any) -> int | None:
    """Optimizer steps per training epoch (batches over gradient accumulation), when known."""
    batches = getattr(trainer, "num_training_batches", None)
    accumulate = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
    return None if batches is None else -(-batches // accumulate)


def logger_step(trainer: Any) -> int:
    # Lightning logs its own metrics at `_batches_that_stepped`, which at on_train_batch_end is
    # still one behind the optimizer step; using the same value keeps memwatch rows aligned with
    # the loss in every logger.
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    value = getattr(loop, "_batches_that_stepped", None)
    return int(value) if isinstance(value, int) else max(int(trainer.global_step) - 1, 0)


def epoch_end_follows(trainer: Any) -> bool:
    """A validation at the end of a training epoch (its last batch done): the epoch's own check
    follows it and reads what it kept."""
    progress = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None),
                       "batch_progress", None)
    return bool(getattr(progress, "is_last_batch", False))
