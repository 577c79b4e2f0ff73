"""Synthetic: a ``deque`` whose ``maxlen`` is only reached late (bounded: not a leak).

Not from a thread. A "replay buffer" of per-step feature arrays (64 KiB numpy copies) is a
``collections.deque`` with ``maxlen`` set from the planned run, ``int(0.8 * total_steps)``: it is
bounded, but the bound is reached only after 80% of the run, so for the first 80% it grows by
64 KiB every step, exactly like an unbounded list, and only the last part of the last epoch is
flat.

Decision (for this corpus, since issue 40): **bounded, not a leak**. A container that carries
its own bound is judged with that bound: what it will hold when full (here 0.8 x steps x 64 KiB,
23 MiB at the quick size) is set against the limit that binds, and it fits, so the growth is a
plateau to come (``plateau`` with ``evidence["pattern"] == "bounded"``), and advice never asks
for a bound it has. Where a run is long enough that the full deque would not fit, the leak
verdict stands (with advice to lower the bound). Until issue 40 this scenario was labelled a leak
("sized by steps, not by memory"); the bound relative to the limit decides now, as for a deque
bounded early (``ctrl_bounded_deque``, ``maxlen=32``). The holder is the module global
``replay_buffer``.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from .. import Scenario
from .._common import BATCH, HIDDEN, epochs_loop, hidden_step, setup

FILL_FRACTION = 0.8

SCENARIO = Scenario(
    name="syn_deque_late_bound",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="synthetic: deque(maxlen=0.8 x total steps) of 64 KiB arrays, bound hit late",
    expected_kind="bounded",
    planted_bytes_per_step=BATCH * HIDDEN * 4 + 112,  # while filling (80% of the run)
)

replay_buffer: collections.deque[np.ndarray] = collections.deque()


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    global replay_buffer
    replay_buffer = collections.deque(maxlen=int(FILL_FRACTION * epochs * steps_per_epoch))
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        replay_buffer.append(hidden.detach().numpy().copy())

    return epochs_loop(mw, epochs, steps_per_epoch, step)
