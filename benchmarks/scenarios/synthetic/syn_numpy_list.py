"""Synthetic leak: a module-level list gains one ~100 KB numpy array every step.

Not from a thread: the plain-numpy form of "I'll keep this for later" (per-step predictions,
embeddings or images converted with ``.numpy()`` and appended to a list that is never cleared).
No tensor is held: the arrays are numpy-owned buffers (12,800 float64 values, 100 KiB each),
which the tensor census cannot see and the garbage collector does not track. The holder is the
module global ``kept_arrays``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

VALUES = 12_800  # float64: 102,400 bytes per array

SCENARIO = Scenario(
    name="syn_numpy_list",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="kept_arrays",
    description="synthetic: a global list gains one 100 KiB numpy array per step",
    planted_bytes_per_step=VALUES * 8 + 112,  # the buffer and its ndarray object
)

kept_arrays: list[np.ndarray] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        feats = hidden.detach().numpy().astype(np.float64).ravel()[:VALUES]
        kept_arrays.append(feats.copy())  # the bug: nothing ever clears it

    return epochs_loop(mw, epochs, steps_per_epoch, step)
