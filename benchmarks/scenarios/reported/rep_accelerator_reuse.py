"""Reported leak: one ``Accelerator`` reused across trainings keeps every prepared model.

Thread: https://github.com/huggingface/accelerate/issues/84 ("Add warning not to reuse
`Accelerator`"). Training several models in one process with one ``Accelerator`` leaked memory:
the reporter traced it to ``prepare``, which appends a reference to each optimizer to the
accelerator's internal list, so an old training's optimizer (and with it its parameters and
state) is never released. The maintainers fixed it by adding ``Accelerator.free_memory()``
(PR 89: "cleans up the internal list to the optimizers"), to call between two trainings; later
examples call it first thing in each loop (PR 739).

Reproduction: a hyperparameter search in one process with the real ``accelerate.Accelerator``
(CPU). Every ``TRIAL_STEPS`` steps a new model and ``AdamW`` are built for the next learning
rate of a grid and passed through ``accelerator.prepare``; the previous trial's objects are
dropped by the loop, but the accelerator's ``_optimizers`` (and ``_models``) lists still hold
them: each trial keeps its weights, last gradients and both Adam moments. The holder named by
the thread is ``accelerator._optimizers``. Fixed twin: ``fix_accelerator_reuse``
(``accelerator.free_memory()`` before each new trial).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, Data, epochs_loop

SOURCE = "https://github.com/huggingface/accelerate/issues/84"
TRIAL_STEPS = 50
WIDTH = 384
LRS = (1e-3, 5e-4, 2e-4, 1e-4)

SCENARIO = Scenario(
    name="rep_accelerator_reuse",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="_optimizers",
    description="accelerate#84: one Accelerator reused per trial keeps every prepared optimizer",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): one trial per 50 steps
    # keeps 0.25 M weights, their gradients and two Adam moments (4 MB).
    planted_bytes_per_step=81_500,
    source=SOURCE,
    reported=True,
)

accelerator: Any = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, frees: bool) -> list[list[Any]]:
    global accelerator
    from accelerate import Accelerator

    accelerator = acc = Accelerator(cpu=True)
    data = Data()
    trial: dict[str, Any] = {}

    def new_trial(n: int) -> None:
        if frees:
            acc.free_memory()  # the fix: drop the previous trial's references first
        torch.manual_seed(n)
        model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                              nn.ReLU(), nn.Linear(WIDTH, CLASSES))
        opt = torch.optim.AdamW(model.parameters(), lr=LRS[n % len(LRS)])
        trial["model"], trial["opt"] = acc.prepare(model, opt)

    def step(epoch: int, i: int) -> None:
        n = epoch * steps_per_epoch + i
        if n % TRIAL_STEPS == 0:
            new_trial(n // TRIAL_STEPS)
        x, y = data.batch(BATCH)
        trial["opt"].zero_grad(set_to_none=True)
        acc.backward(nn.functional.cross_entropy(trial["model"](x), y))
        trial["opt"].step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, frees=False)
