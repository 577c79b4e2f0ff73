"""Reported non-leak: a replay memory fills up to its capacity, then memory stops growing.

Thread: https://github.com/toshikwa/sac-discrete.pytorch/issues/28 ("Memory Leak"). Running the
repository's SAC-Discrete on Atari, the reporter saw memory grow by a steady amount every minute
or two and suspected a leak. The maintainers answered that the replay memory's capacity
(300,000 transitions of 84 x 84 frames by default, about 2 GB) is filled as the agent steps, so
memory grows until the agent reaches that many steps and no further; the reporter agreed it was
a misunderstanding. The repository's ``LazyMemory`` appends each transition's ``state`` and
``next_state`` frames to two lists and deletes the oldest once a list is longer than the
capacity; actions, rewards and done flags go into preallocated arrays.

Reproduction: a discrete-action agent steps a pixel environment (4 stacked 96 x 96 ``uint8``
frames per observation) and learns from batches sampled out of a ``LazyMemory`` of
``CAPACITY`` transitions (two new frames, 72 KiB, per step). Memory grows for ``CAPACITY``
steps, the middle of the second epoch at the quick sizes, and is flat after. A correct verdict is
bounded (a plateau once the memory is full), not a leak. Twin: ``ho_fix_replay_memory_fills`` (a
memory of a tenth of the capacity, full within the first epoch's warm-up: what a smaller
``memory_size`` gives, the knob the thread points at).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, MLP, epochs_loop, pixel_features

SOURCE = "https://github.com/toshikwa/sac-discrete.pytorch/issues/28"
FRAME = (4, 96, 96)  # 4 stacked frames, uint8: 36 KiB
CAPACITY = 240  # transitions; full at step 240

SCENARIO = Scenario(
    name="ho_rep_replay_memory_fills",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="sac-discrete#28: replay memory of 240 transitions fills mid-run, then flat",
    expected_kind="bounded",
    source=SOURCE,
    split="heldout",
    reported=True,
    growth="stops",
    stops_at_step=CAPACITY,
)


class LazyMemory(dict[str, Any]):
    """Frames in two lists cut back to the capacity; scalars in preallocated arrays."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self["state"] = []
        self["next_state"] = []
        self["action"] = np.empty((capacity, 1), dtype=np.int64)
        self["reward"] = np.empty((capacity, 1), dtype=np.float32)
        self["done"] = np.empty((capacity, 1), dtype=np.float32)
        self._n = 0
        self._p = 0

    def append(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray,
               done: bool) -> None:
        self["state"].append(state)
        self["next_state"].append(next_state)
        self["action"][self._p] = action
        self["reward"][self._p] = reward
        self["done"][self._p] = done
        self._n = min(self._n + 1, self.capacity)
        self._p = (self._p + 1) % self.capacity
        while len(self["state"]) > self.capacity:  # the bound
            del self["state"][0]
            del self["next_state"][0]

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        held = len(self["state"])
        idx = rng.integers(0, held, size=size)
        states = np.stack([self["state"][i] for i in idx])
        # List position i holds the transition written at ring position p - held + i.
        return states, self["action"][(self._p - held + idx) % self.capacity, 0]

    def __len__(self) -> int:
        return self._n


class PixelEnv:
    """Observations are fresh frames (as an emulator renders them); one in 50 steps ends."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        frame = self.rng.integers(0, 256, size=FRAME, dtype=np.uint8)
        return frame, float(action % 2), bool(self.rng.random() < 0.02)


def _run(mw: Any, epochs: int, steps_per_epoch: int, capacity: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    memory = LazyMemory(capacity)
    env = PixelEnv()
    rng = np.random.default_rng(1)
    state = env.step(0)[0]

    def step(epoch: int, i: int) -> None:
        nonlocal state
        with torch.no_grad():
            action = int(model(pixel_features(state[None])).argmax()) % CLASSES
        next_state, reward, done = env.step(action)
        memory.append(state, action, reward, next_state, done)
        state = env.step(0)[0] if done else next_state
        states, actions = memory.sample(rng, BATCH)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(pixel_features(states)),
                                           torch.from_numpy(actions % CLASSES))
        loss.backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, capacity=CAPACITY)
