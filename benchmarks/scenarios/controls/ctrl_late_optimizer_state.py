"""Control: the optimizer changes at the start of epoch 2: SGD warm-up, then Adam.

Adam's ``exp_avg``/``exp_avg_sq`` state (two copies of the parameters, ~3 MiB with this wider
model) is created at its first step: one step change, then flat. A learning-rate schedule runs
throughout (it holds no tensors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import CLASSES, IN_DIM, Data, epochs_loop

SCENARIO = Scenario(
    name="ctrl_late_optimizer_state",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="optimizer state created late (SGD, then Adam from epoch 2): a step change",
    expected_kind="step_change",
)

WIDE = 512


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN_DIM, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE), nn.ReLU(),
                          nn.Linear(WIDE, CLASSES))
    data = Data()
    state: dict[str, Any] = {"opt": torch.optim.SGD(model.parameters(), lr=0.01)}
    state["sched"] = torch.optim.lr_scheduler.StepLR(state["opt"], step_size=50, gamma=0.9)

    def step(epoch: int, i: int) -> None:
        if epoch == 1 and i == 0:
            state["opt"] = torch.optim.Adam(model.parameters(), lr=1e-3)
            state["sched"] = torch.optim.lr_scheduler.StepLR(state["opt"], step_size=50, gamma=0.9)
        opt = state["opt"]
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        state["sched"].step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)
