"""Reported leak: training-step output dicts kept in the module's list and never cleared, in a
run that also validates.

Thread: https://github.com/Lightning-AI/pytorch-lightning/pull/16520 ("Remove memory-retaining
epoch-end hooks", merged for Lightning 2.0; see ``rep_val_outputs_uncleared``). Its migration
guide: ``training_step`` appends to ``self.training_step_outputs``, ``on_train_epoch_end`` reads
the list and calls ``self.training_step_outputs.clear()  # free memory``. Without the clear the
list keeps every step's outputs across epochs: the memory Lightning 1.x held for one epoch, now
held for the whole run.

Reproduction: a Lightning-2-style classifier (``_lightning2.py``) whose ``training_step`` appends
a dict per step (the loss, the logits and the hidden activation, each still attached to the
step's graph after ``backward()`` freed its saved tensors: 68 KiB of outputs and the graph's
nodes) to ``training_step_outputs``; ``on_train_epoch_end`` logs their mean loss without
clearing. The run validates every ``VAL_EVERY`` steps, and validation is clean (its outputs are
cleared at each validation end): the leak grows in the training steps only. The holder is
``training_step_outputs``. Fixed twin: ``fix_train_outputs_uncleared`` (the guide's ``clear()``:
outputs held for one epoch, then freed).
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from ._lightning2 import LitClassifier, fit

SOURCE = "https://github.com/Lightning-AI/pytorch-lightning/pull/16520"
VAL_EVERY = 50
VAL_BATCHES = 5

SCENARIO = Scenario(
    name="rep_train_outputs_uncleared",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="training_step_outputs",
    description="lightning#16520: training_step_outputs (dicts of outputs) never cleared",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): per step the hidden
    # activation (64 x 256) and logits (64 x 16), float32, 68 KiB, and the loss with the nodes
    # of the step's graph (their saved tensors freed by backward()).
    planted_bytes_per_step=79_000,
    source=SOURCE,
    reported=True,
    eval_every=VAL_EVERY,
)


def _run(mw: Any, epochs: int, steps_per_epoch: int, clear: bool) -> list[list[Any]]:
    module = LitClassifier(keep_train_outputs=True, clear_train=clear, clear_val=True)
    return fit(mw, module, epochs, steps_per_epoch, VAL_EVERY, VAL_BATCHES)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, clear=False)
