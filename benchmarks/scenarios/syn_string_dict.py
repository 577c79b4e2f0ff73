"""Synthetic leak: a module-level dict of strings gains one formatted log record every step.

Not from a thread: a "debug log" kept in memory, keyed by step, whose values are the step's
logits formatted as text (about 8.8 KB per step). Only ``str`` objects grow: nothing the tensor
census counts, nothing the garbage collector tracks (a dict holding only strings is untracked).
The holder is the module global ``step_log``.
"""

from __future__ import annotations

from typing import Any

from . import Scenario
from ._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="syn_string_dict",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="step_log",
    description="synthetic: a global dict gains one ~8.8 KB formatted string per step",
    # Measured (glibc in-use bytes): the formatted record (64 x 16 logits), its key, the slot.
    planted_bytes_per_step=8_850,
)

step_log: dict[str, str] = {}


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        record = ",".join(f"{v:.5f}" for v in out.detach().flatten().tolist())
        step_log[f"epoch{epoch}/step{i}"] = record  # the bug: never written out, never cleared

    return epochs_loop(mw, epochs, steps_per_epoch, step)
