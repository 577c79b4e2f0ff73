"""Reported leak: per-sample-gradient hooks keep every activation seen under ``torch.no_grad()``.

Thread: https://github.com/meta-pytorch/opacus/issues/176 ("torch.no_grad() creates memory leak
because of forward hook"). Opacus's forward hook appends each layer's input to
``module.activations`` and its backward hook pops it to compute per-sample gradients. The
reporter evaluated inside ``with torch.no_grad():`` with the model still in training mode: the
forward hooks kept saving activations, no backward ever popped them, and they were never freed.
Calling ``model.eval()`` for the evaluation fixed it; the maintainers agreed and planned to make
the hook skip no-grad passes (later versions check ``torch.is_grad_enabled()``).

Reproduction: the MLP gets Opacus-style hooks on ``fc1``/``fc2``/``fc3`` (forward: append
``input.detach()`` to ``module.activations`` when ``module.training``, as in the version of the
report; backward: pop it and compute each sample's gradient norm, what DP-SGD clips). Training
steps push and pop in balance. Every ``VAL_EVERY`` steps one validation batch runs under
``torch.no_grad()`` without ``model.eval()``: three 64 x 256 inputs stay in the three
``activations`` lists for good. Fixed twin: ``fix_hook_activations`` (``model.eval()``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, HIDDEN, IN_DIM, MLP, epochs_loop, setup

SOURCE = "https://github.com/meta-pytorch/opacus/issues/176"
VAL_EVERY = 4  # one validation batch every 4 optimizer steps

SCENARIO = Scenario(
    name="rep_hook_activations",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="activations",
    description="opacus#176: hooks keep activations of no_grad validation run in train mode",
    # The inputs of fc1, fc2 and fc3 of one validation batch, every VAL_EVERY steps.
    planted_bytes_per_step=BATCH * (IN_DIM + 2 * HIDDEN) * 4 / VAL_EVERY,
    source=SOURCE,
    reported=True,
)

per_sample_norms: list[float] = []  # last step's clipping statistic, for show


def _capture_activations(module: nn.Module, inputs: tuple[torch.Tensor, ...],
                         output: torch.Tensor) -> None:
    if not module.training:  # the version of the report had no torch.is_grad_enabled() check
        return
    if not hasattr(module, "activations"):
        module.activations = []  # type: ignore[assignment]
    module.activations.append(inputs[0].detach())  # type: ignore[union-attr, operator]


def _capture_backprops(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
    activations = module.activations.pop()  # type: ignore[union-attr, operator]
    backprops = grad_output[0].detach()
    # Per-sample gradient norm of a Linear weight: ||g_i|| * ||a_i||.
    norms = backprops.norm(dim=1) * activations.norm(dim=1)
    per_sample_norms[:] = [float(norms.max())]


def add_hooks(model: MLP) -> None:
    # fc1's input needs no gradient: torch says once that the hook fires on outputs only.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    for layer in (model.fc1, model.fc2, model.fc3):
        layer.register_forward_hook(_capture_activations)
        layer.register_full_backward_hook(_capture_backprops)


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    model, opt, data = setup()
    add_hooks(model)
    val = type(data)(seed=7)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i % VAL_EVERY == VAL_EVERY - 1:
            if fixed:
                model.eval()  # the fix from the thread
            with torch.no_grad():
                vx, vy = val.batch()
                model(vx)
            model.train()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
