"""Reported leak: validation outputs kept in the module's list and never cleared grow at every
validation.

Thread: https://github.com/Lightning-AI/pytorch-lightning/pull/16520 ("Remove memory-retaining
epoch-end hooks", merged for Lightning 2.0). The maintainers removed ``validation_epoch_end
(outputs)`` and ``training_epoch_end(outputs)`` because Lightning had to keep every step's output
in memory to call them. The PR's migration guide moves that list into the module:
``validation_step`` appends to ``self.validation_step_outputs``, ``on_validation_epoch_end``
reads it and then calls ``self.validation_step_outputs.clear()  # free memory``. Without that
clear, the list keeps every validation's outputs for the rest of the run and grows at each
validation: the leak the guide's line prevents.

Reproduction: a Lightning-2-style classifier (``_lightning2.py``) validated every ``VAL_EVERY``
training steps on ``VAL_BATCHES`` batches of 128 under ``no_grad``; each ``validation_step``
appends its loss, predictions and the batch's hidden features (136 KiB) to
``validation_step_outputs``, and ``on_validation_epoch_end`` computes the mean loss without
clearing the list. Training keeps nothing. Memory grows only during validations (1.3 MiB each,
every 30 steps) and is flat through the training steps between them. The holder is
``validation_step_outputs``. Fixed twin: ``fix_val_outputs_uncleared`` (the guide's ``clear()``).
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._common import CLASSES, HIDDEN
from ._lightning2 import VAL_BATCH, LitClassifier, fit

SOURCE = "https://github.com/Lightning-AI/pytorch-lightning/pull/16520"
VAL_EVERY = 30
VAL_BATCHES = 10
# Per validation: VAL_BATCHES x (features 128 x 256 + predictions 128 x 16, float32).
VAL_BYTES = VAL_BATCHES * VAL_BATCH * (HIDDEN + CLASSES) * 4

SCENARIO = Scenario(
    name="rep_val_outputs_uncleared",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="validation_step_outputs",
    description="lightning#16520: validation_step_outputs never cleared, grows at each validation",
    planted_bytes_per_step=VAL_BYTES / VAL_EVERY,
    source=SOURCE,
    reported=True,
    growth="eval",
    eval_every=VAL_EVERY,
)


def _run(mw: Any, epochs: int, steps_per_epoch: int, clear: bool) -> list[list[Any]]:
    module = LitClassifier(keep_train_outputs=False, clear_train=True, clear_val=clear)
    return fit(mw, module, epochs, steps_per_epoch, VAL_EVERY, VAL_BATCHES)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, clear=False)
