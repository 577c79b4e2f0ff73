"""Control: warm-up then plateau: a feature cache keyed by sample index fills, then only hits.

The training set has 2,048 samples; the cache stores a 1 KiB feature row per sample the first time
it is seen, so it grows during roughly the first epoch (2 MiB in all) and then stops for good.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SCENARIO = Scenario(
    name="ctrl_warmup_plateau",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="warm-up then plateau: per-sample feature cache bounded by the dataset size",
    expected_kind="plateau",
)

N_SAMPLES = 2048
feature_cache: dict[int, torch.Tensor] = {}


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    g = torch.Generator().manual_seed(3)

    def step(epoch: int, i: int) -> None:
        idx = torch.randint(0, N_SAMPLES, (64,), generator=g)
        rows = []
        for j in idx.tolist():
            f = feature_cache.get(j)
            if f is None:
                f = data.x[j].clone()  # "expensive preprocessing", done once per sample
                feature_cache[j] = f
            rows.append(f)
        x, y = torch.stack(rows), data.y[idx]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)
