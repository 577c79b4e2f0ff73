"""Control: a large temporary every 20 steps (a 16 MiB Gram matrix for a diagnostic), freed at once.

Spikes of the per-step footprint with nothing kept between them.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="ctrl_periodic_temporaries",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="periodic large temporaries (16 MiB every 20 steps), freed immediately",
    expected_kind="none",
)

EVERY = 20
diagnostics: list[float] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        if i % EVERY == 0:
            feats = data.x[:2048, :64]  # 64 features keep the matmul cheap; the result is big
            gram = feats @ feats.T  # 2048 x 2048 float32 = 16 MiB, gone after this line
            diagnostics.append(float(gram.diagonal().mean()))
            del gram

    return epochs_loop(mw, epochs, steps_per_epoch, step)
