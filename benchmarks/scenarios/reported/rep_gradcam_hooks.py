"""Reported leak: every Grad-CAM object leaves its hooks, and their lists, on the model.

Thread: https://github.com/jacobgil/pytorch-grad-cam/issues/132 ("Memory leakage when calling
multiple instances in a loop"). Creating a new ``GradCAM`` in a loop made memory build up even
after deleting it. The maintainer's diagnosis: the ``ActivationsAndGradients`` object is not
deleted and its hooks are not un-registered; he fixed it (the CAM releases its hooks when it is
deleted or leaves a ``with`` block, the usage recommended since in #483). The same library in a
training loop (#117, "The training gets killed": a new CAM made by a helper to watch the model
during training, memory up to 441 GB after 11 epochs) is the setting reproduced here.

Reproduction: at the end of every epoch a helper builds a new ``GradCAM`` on ``model.fc2`` (as
pytorch-grad-cam 1.3 does: an ``ActivationsAndGradients`` registers a forward hook that appends
each output to ``activations`` and a tensor hook that prepends each gradient to ``gradients``),
computes one map and returns it; the CAM object is dropped. Its hooks stay registered on
``fc2``, so from then on every training step's forward and backward also run every old hook, each
appending the step's activation and gradient (64 x 256 floats each) to lists nobody reads or
clears. The holder is reached only through the layer's hook registry:
``model.fc2._forward_hooks``. Nothing is kept in epoch 0; from epoch 1 on each step keeps one
activation and one gradient (the old CAMs' lists all hold views of the same two tensors, so the
bytes per step do not rise with their number, only the list entries do).
Fixed twin: ``fix_gradcam_hooks`` (the CAM used in a ``with`` block, which removes the hooks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, epochs_loop, plain_step, setup

SOURCE = "https://github.com/jacobgil/pytorch-grad-cam/issues/132"

SCENARIO = Scenario(
    name="rep_gradcam_hooks",
    is_leak=True,
    leak_start_epoch=1,
    expected_metric="host",
    expected_culprit="_forward_hooks",
    description="pytorch-grad-cam#132: a new GradCAM per epoch leaves hooks that store every step",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): from epoch 1, the step's
    # fc2 output and its gradient (2 x 64 KiB) plus the list entries: 133 KB per step.
    planted_bytes_per_step=133_000,
    source=SOURCE,
    reported=True,
)


class ActivationsAndGradients:
    """pytorch-grad-cam 1.3's hook holder: lists reset only when the CAM itself runs."""

    def __init__(self, model: nn.Module, target_layer: nn.Module) -> None:
        self.model = model
        self.gradients: list[torch.Tensor] = []
        self.activations: list[torch.Tensor] = []
        self.handles = [target_layer.register_forward_hook(self.save_activation),
                        target_layer.register_forward_hook(self.save_gradient)]

    def save_activation(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self.activations.append(output.cpu().detach())

    def save_gradient(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if not output.requires_grad:
            return

        def _store_grad(grad: torch.Tensor) -> None:
            self.gradients = [grad.cpu().detach()] + self.gradients

        output.register_hook(_store_grad)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.gradients = []
        self.activations = []
        return self.model(x)  # type: ignore[no-any-return]

    def release(self) -> None:
        for handle in self.handles:
            handle.remove()


class GradCAM:
    """One class-activation map for a batch: weights = mean gradient, map = ReLU(weighted sum)."""

    def __init__(self, model: nn.Module, target_layer: nn.Module,
                 releases: bool = False) -> None:
        self.model = model
        self.activations_and_grads = ActivationsAndGradients(model, target_layer)
        self.releases = releases  # the fix of #132: release the hooks on delete / with-exit

    def __call__(self, x: torch.Tensor, category: int) -> np.ndarray:
        out = self.activations_and_grads(x)
        self.model.zero_grad()
        out[:, category].sum().backward(retain_graph=True)
        act = self.activations_and_grads.activations[-1]
        grad = self.activations_and_grads.gradients[0]
        cam = torch.relu((grad.mean(dim=0, keepdim=True) * act).sum(dim=1))
        return (cam / (cam.max() + 1e-7)).numpy()

    def __enter__(self) -> GradCAM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.activations_and_grads.release()

    def __del__(self) -> None:
        if self.releases:
            self.activations_and_grads.release()


cams_per_epoch: list[float] = []


def cam_extractor(model: nn.Module, x: torch.Tensor, use_with: bool) -> np.ndarray:
    """The user's helper: a new CAM per call (as in #117 and #132)."""
    if use_with:
        with GradCAM(model, model.fc2, releases=True) as cam:  # type: ignore[arg-type]
            return cam(x, category=3)
    cam = GradCAM(model, model.fc2)  # type: ignore[arg-type]
    return cam(x, category=3)


def _run(mw: Any, epochs: int, steps_per_epoch: int, use_with: bool) -> list[list[Any]]:
    model, opt, data = setup()
    x_vis, _ = data.batch(BATCH)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)

    def on_epoch_end(epoch: int) -> None:
        cams_per_epoch.append(float(cam_extractor(model, x_vis, use_with).mean()))
        opt.zero_grad(set_to_none=True)

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=on_epoch_end)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, use_with=False)
