"""Reported leak: a class-level ``lru_cache`` on a module's method keeps every model alive.

Thread: https://github.com/huggingface/transformers/issues/45412 ("RT-DETR models do not release
memory when deleted / garbage-collected"). Deleting an RT-DETR model and collecting left its
memory allocated. The cause, narrowed down in the thread and its pull requests: methods wrapped
by ``compile_compatible_method_lru_cache`` (a ``functools.lru_cache``; the model's
``generate_anchors``, the sine position embedding's ``forward``) keep their cache on the class,
and ``self`` is part of every key, so the cache holds every instance that ever called the method,
and through it the model. PR 45922 ("Fix memory leaks caused by lru decorators in vision models:
Lru decorators were keeping references to entire models", merged) moved the caching to
standalone functions whose keys hold no model.

Reproduction: a hyperparameter search in one process, the setting where models are created and
dropped while the process lives. Every ``TRIAL_STEPS`` steps a new ``TinyDetector`` is built with
the next learning rate of a grid and trained; the previous one is dropped. Its
``generate_anchors`` (anchor features of the 8 x 8 grid, cached at class level like
RT-DETR's, ``maxsize=32``) runs at every forward, so the class's cache keeps each trial's model
with its weights, its last gradients and its cached anchors. The holder is the cache of
``TinyDetector.generate_anchors``. Fixed twin: ``ho_fix_method_lru_cache`` (the anchors cached by a
module-level function keyed by the grid size only, as in the merged fix).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import CLASSES, IN_DIM, Data, epochs_loop

SOURCE = "https://github.com/huggingface/transformers/issues/45412"
TRIAL_STEPS = 50
WIDTH = 512
GRID = 8  # an 8 x 8 feature map: 64 tokens, one per sample of the batch
LRS = (0.1, 0.05, 0.02, 0.01)

SCENARIO = Scenario(
    name="ho_rep_method_lru_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="generate_anchors",
    description="transformers#45412: class-level lru_cache on a method keeps every trial's model",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): one model per 50 steps
    # (0.4 M weights and their last gradients, 3.2 MB, and 128 KiB of cached anchor features).
    planted_bytes_per_step=67_500,
    source=SOURCE,
    split="heldout",
    reported=True,
)


def _anchors(height: int, width: int, dim: int) -> torch.Tensor:
    """(height * width, dim) features of a grid's anchor boxes (centres and sizes, sine-encoded)."""
    y, x = torch.meshgrid((torch.arange(height, dtype=torch.float32) + 0.5) / height,
                          (torch.arange(width, dtype=torch.float32) + 0.5) / width,
                          indexing="ij")
    boxes = torch.stack([x.flatten(), y.flatten(), torch.full((height * width,), 1.0 / width),
                         torch.full((height * width,), 1.0 / height)], dim=1)
    freqs = torch.arange(1, dim // 8 + 1, dtype=torch.float32) * math.pi
    phases = boxes[:, :, None] * freqs[None, None, :]
    return torch.cat([phases.sin(), phases.cos()], dim=2).flatten(1)


class TinyDetector(nn.Module):
    """A detector head whose ``generate_anchors`` is cached as in the report."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN_DIM, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    @functools.lru_cache(maxsize=32)  # noqa: B019 (the reported bug: the class's cache keeps self)
    def generate_anchors(self, height: int, width: int) -> torch.Tensor:
        return _anchors(height, width, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(tokens)) + self.generate_anchors(GRID, GRID) / math.sqrt(WIDTH)
        return self.head(torch.relu(self.fc2(h)))


@functools.lru_cache(maxsize=32)
def cached_anchors(height: int, width: int, dim: int) -> torch.Tensor:
    """The merged fix's shape: a standalone cached function, no module in its key."""
    return _anchors(height, width, dim)


class FixedTinyDetector(TinyDetector):
    def generate_anchors(self, height: int, width: int) -> torch.Tensor:  # type: ignore[override]
        return cached_anchors(height, width, WIDTH)


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    data = Data()
    trial: dict[str, Any] = {}

    def new_trial(n: int) -> None:
        torch.manual_seed(n)
        # The previous trial's model is dropped here (and freed, unless a cache keeps it).
        trial["model"] = model = (FixedTinyDetector if fixed else TinyDetector)()
        trial["opt"] = torch.optim.SGD(model.parameters(), lr=LRS[n % len(LRS)], momentum=0.9)

    def step(epoch: int, i: int) -> None:
        n = epoch * steps_per_epoch + i
        if n % TRIAL_STEPS == 0:
            new_trial(n // TRIAL_STEPS)
        x, y = data.batch(GRID * GRID)
        trial["opt"].zero_grad(set_to_none=True)
        nn.functional.cross_entropy(trial["model"](x), y).backward()
        trial["opt"].step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
