"""What the transformers callback reads of a ``Trainer`` whose events do not carry it: the
trainer itself and the checkpoint it resumes from (up the caller's frames), the folder it saves a
step's checkpoint in, and where a callback must sit among the reporting callbacks."""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

from transformers import Trainer
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from memwatch.integrations._framework import from_caller_frames

__all__ = ["before_reporters", "calling_trainer", "checkpoint_folder", "resume_checkpoint"]

#: The callbacks of ``report_to`` integrations (W&B, TensorBoard, MLflow...).
REPORTERS: tuple[type, ...] = tuple(
    c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type))


def calling_trainer() -> Any:
    """The ``Trainer`` whose event is being dispatched (``TrainerCallback`` events carry none;
    the handler is called from a ``Trainer`` method a few frames up)."""
    return from_caller_frames(lambda f: f.f_locals.get("self") if isinstance(
        f.f_locals.get("self"), Trainer) else None)


def resume_checkpoint() -> str | None:
    """The checkpoint folder ``Trainer.train(resume_from_checkpoint=...)`` resumes from (the
    training loop's argument, already resolved from ``True``)."""
    def pick(f: FrameType) -> str | None:
        value = f.f_locals.get("resume_from_checkpoint") \
            if isinstance(f.f_locals.get("self"), Trainer) else None
        return os.fspath(value) if isinstance(value, (str, os.PathLike)) else None

    return from_caller_frames(pick)  # type: ignore[no-any-return]


def checkpoint_folder(trainer: Any, args: Any, step: int) -> str:
    """The folder the trainer saves the checkpoint of ``step`` in (under a trial's folder during a
    hyper-parameter search)."""
    try:
        run_dir = str(trainer._get_output_dir(trial=getattr(trainer, "_trial", None)))
    except Exception:  # noqa: BLE001 - no trainer: the arguments' output folder
        run_dir = str(getattr(args, "output_dir", None) or os.getcwd())
    return os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def before_reporters(callbacks: list[Any], cb: Any) -> None:
    """Move ``cb`` in front of the reporting callbacks: they read ``logs`` in list order, and
    memwatch must add its keys before they run. Only ``cb`` moves; everybody else keeps their
    order."""
    first = next((i for i, c in enumerate(callbacks) if isinstance(c, REPORTERS)), None)
    if cb in callbacks and first is not None and callbacks.index(cb) > first:
        callbacks.remove(cb)
        callbacks.insert(first, cb)
