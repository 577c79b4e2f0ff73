"""Reported non-leak: a preallocated replay ring buffer grows resident as it is written, then stops.

Thread: https://github.com/MishaLaskin/curl/issues/10 ("Memory Usage Increasing Continuously").
Running CURL's default configuration, host memory grew until the OS killed the process after
about 8,000 iterations on a 16 GB machine. The reporter found, and the author acknowledged, that
there was no leak: the replay buffer's capacity is large ("The memory increases because the
replay buffer capacity is large. There is no memory leak"). CURL's ``ReplayBuffer`` allocates
``obses``, ``next_obses`` (pixel observations, ``uint8``), actions, rewards and done flags as
``np.empty`` arrays of the full capacity and writes transition ``idx`` in place, wrapping to 0
once full; the pages of ``np.empty`` are not resident until written, so the process's memory
grows with every transition until the buffer is full and is flat after.

Reproduction: an agent on 9 x 84 x 84 pixel observations (CURL's 3 stacked RGB frames) with a
``ReplayBuffer`` of ``CAPACITY`` transitions; every step writes one transition (two
observations, 127 KiB) and trains on a sampled batch. The arrays' size never changes; what is
resident grows for ``CAPACITY`` steps, then stays. A correct verdict is bounded (a plateau),
not a leak. Twin: ``fix_ring_buffer_prealloc`` (a capacity of a tenth, full in the warm-up).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, MLP, epochs_loop, pixel_features

SOURCE = "https://github.com/MishaLaskin/curl/issues/10"
OBS = (9, 84, 84)  # 3 stacked RGB frames, uint8: 63.5 KiB
ACTION_DIM = 6
CAPACITY = 200  # transitions; full at step 200

SCENARIO = Scenario(
    name="rep_ring_buffer_prealloc",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="curl#10: preallocated 200-transition ring buffer becomes resident, then flat",
    expected_kind="bounded",
    source=SOURCE,
    reported=True,
    growth="stops",
    stops_at_step=CAPACITY,
)


class ReplayBuffer:
    """Fixed-size arrays written in place; ``idx`` wraps to 0 once ``full``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.obses = np.empty((capacity, *OBS), dtype=np.uint8)
        self.next_obses = np.empty((capacity, *OBS), dtype=np.uint8)
        self.actions = np.empty((capacity, ACTION_DIM), dtype=np.float32)
        self.rewards = np.empty((capacity, 1), dtype=np.float32)
        self.not_dones = np.empty((capacity, 1), dtype=np.float32)
        self.idx = 0
        self.full = False

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
            done: bool) -> None:
        np.copyto(self.obses[self.idx], obs)
        np.copyto(self.actions[self.idx], action)
        np.copyto(self.rewards[self.idx], reward)
        np.copyto(self.next_obses[self.idx], next_obs)
        np.copyto(self.not_dones[self.idx], not done)
        self.idx = (self.idx + 1) % self.capacity
        self.full = self.full or self.idx == 0

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        idxs = rng.integers(0, self.capacity if self.full else self.idx, size=size)
        return self.obses[idxs], self.actions[idxs]


def _run(mw: Any, epochs: int, steps_per_epoch: int, capacity: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    buffer = ReplayBuffer(capacity)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, size=OBS, dtype=np.uint8)

    def step(epoch: int, i: int) -> None:
        nonlocal obs
        action = rng.uniform(-1.0, 1.0, size=ACTION_DIM).astype(np.float32)
        next_obs = rng.integers(0, 256, size=OBS, dtype=np.uint8)  # the rendered frames
        done = bool(rng.random() < 0.01)
        buffer.add(obs, action, float(action.sum()), next_obs, done)
        obs = next_obs
        obses, actions = buffer.sample(rng, BATCH)
        target = torch.from_numpy((actions[:, 0] > 0).astype(np.int64) * (CLASSES - 1))
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(pixel_features(obses)), target).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, capacity=CAPACITY)
