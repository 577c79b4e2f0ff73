"""Synthetic leak: a module-level dict of strings gains one formatted log record every step.

Not from a thread: a "debug log" kept in memory, keyed by step, whose values are the step's
logits and the first 64 hidden features of each sample formatted as text (about 41.6 KB per
step; a first version logged the logits alone, 8.8 KB a step, 1.3 MiB an epoch at the quick
sizes: under the start-up noise of the process's RSS, found at the third epoch or not at all,
so no test of naming strings). Only ``str`` objects grow: nothing the tensor census counts,
nothing the garbage collector tracks (a dict holding only strings is untracked).
The holder is the module global ``step_log``.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="syn_string_dict",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="step_log",
    description="synthetic: a global dict gains one ~41.6 KB formatted string per step",
    # Measured (glibc in-use bytes, mallinfo2, over 400 steps after 50): the formatted record
    # (64 x 16 logits and 64 x 64 hidden features, 41.5 KB of text), its key, the slot.
    planted_bytes_per_step=41_640,
)

step_log: dict[str, str] = {}


def _record(hidden: torch.Tensor, out: torch.Tensor) -> str:
    values = torch.cat([out.detach().flatten(), hidden.detach()[:, :64].flatten()])
    return ",".join(f"{v:.5f}" for v in values.tolist())


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        record = _record(hidden, out)
        step_log[f"epoch{epoch}/step{i}"] = record  # the bug: never written out, never cleared

    return epochs_loop(mw, epochs, steps_per_epoch, step)
