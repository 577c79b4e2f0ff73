"""Reported leak: a ``functools.cache`` keyed by the model keeps every checkpointed model alive.

Thread: https://github.com/pytorch/pytorch/pull/149354 ("[State_dict] Remove functools.cache and
add unit test", fixing pytorch/pytorch#149100). In ``torch.distributed.checkpoint.state_dict``
the helper ``_get_fqns(model, name, ...)``, called for every parameter by
``get_model_state_dict`` / ``get_state_dict``, was decorated with ``@functools.cache``: the cache
key holds the model, so "if the model is deleted, the model's memory is still occupied". The PR
removed the cache and added a test that a model is freed after its state dict was taken (torch
2.13's ``_get_fqns`` has no cache; a comment at its caller still says "_get_fqns is
lru_cached").

Reproduction: training with a per-epoch evaluation snapshot: at every epoch end the loop
deep-copies the model (a stochastic-weight-averaging-style copy for evaluation), takes its state
dict through a ``get_model_state_dict`` that resolves names with a ``functools.cache``-decorated
``_get_fqns`` (as in the version of the report), serializes it as a checkpoint, evaluates the
copy and drops it. The cache keeps each copy: a stair of one model (1.3 M weights, 5.3 MB) at
every epoch end, flat in between. The holder is the cache of ``_get_fqns``. Fixed twin:
``ho_fix_fqn_cache_snapshots`` (no cache, as in the PR).
"""

from __future__ import annotations

import copy
import functools
import io
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, Data, epochs_loop

SOURCE = "https://github.com/pytorch/pytorch/pull/149354"
WIDTH = 1024
# One model's weights per epoch: IN_DIM x WIDTH + WIDTH x WIDTH + WIDTH x CLASSES and biases.
MODEL_BYTES = 4 * (IN_DIM * WIDTH + WIDTH * WIDTH + WIDTH * CLASSES + 2 * WIDTH + CLASSES)

SCENARIO = Scenario(
    name="ho_rep_fqn_cache_snapshots",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="_get_fqns",
    description="pytorch#149100: functools.cache on _get_fqns keeps every epoch's model snapshot",
    # A stair of one model per epoch; per step at the quick sizes (150-step epochs).
    planted_bytes_per_step=MODEL_BYTES / 150,
    source=SOURCE,
    split="heldout",
    reported=True,
    growth="stairs",
)


class WideMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN_DIM, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.fc3 = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _fqns(model: nn.Module, name: str) -> set[str]:
    """The canonical names of a parameter, walking the modules (wrappers would be skipped)."""
    obj: Any = model
    parts = name.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    return {".".join(parts)}


@functools.cache  # the reported bug: the model is part of every key
def _get_fqns(model: nn.Module, name: str) -> set[str]:
    return _fqns(model, name)


def get_model_state_dict(model: nn.Module, cached: bool) -> dict[str, torch.Tensor]:
    resolve = _get_fqns if cached else _fqns
    return {fqn: p.detach() for name, p in model.named_parameters() for fqn in resolve(model, name)}


def _run(mw: Any, epochs: int, steps_per_epoch: int, cached: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    model = WideMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data, val = Data(), Data(seed=7)
    _get_fqns.cache_clear()
    scores: list[float] = []

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def snapshot(epoch: int) -> None:
        averaged = copy.deepcopy(model)  # the evaluation copy
        checkpoint = io.BytesIO()
        torch.save(get_model_state_dict(averaged, cached), checkpoint)
        with torch.no_grad():
            vx, vy = val.batch(4 * BATCH)
            scores.append(float((averaged(vx).argmax(1) == vy).float().mean()))
        del averaged, checkpoint  # dropped (and freed, unless the cache keeps it)

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=snapshot)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, cached=True)
