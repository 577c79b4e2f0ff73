"""Reported non-leak: an augmentation's patch pool fills its ``deque(maxlen=...)``, then stays.

Thread: https://github.com/JDAI-CV/fast-reid/issues/673 (host memory growing during training
until it took the whole server; closed without a maintainer's diagnosis). The thread's two
findings: the memory grows only during the first three epochs and is stable afterwards ("only
the first 3 epochs leak, then it is stable"), and it stops growing when the ``RandomPatch``
augmentation is removed. Both fit fast-reid's ``RandomPatch`` (after Zhou et al.): it crops a
random patch from every image it sees and appends it to ``self.patchpool``, a
``collections.deque(maxlen=pool_capacity)`` of 50,000 patches by default, from which it pastes
patches onto later images; the pool grows with every image until it holds ``pool_capacity``
patches (our arithmetic: about 4 epochs of Market-1501's 12,936 training images) and is
replaced, not extended, after. Labelled by those findings: growth that stops at the pool's
bound, not a leak.

Reproduction: person re-identification-style training on 3 x 64 x 32 ``uint8`` images (a
training set of ``IMAGES`` decoded images in memory, read in order), batch 64: each image is
copied into the batch and passed through ``RandomPatch`` in the main process (``num_workers=0``),
which pastes in place, with a pool of ``POOL`` patches (patches of 1-50% of the image, about
1.7 KiB each on average: glibc's in-use bytes grow by ~107 KB a step while the pool fills, 21 MiB
in all; RSS by about three times that, as patches of random sizes and their replacements
fragment the heap). The pool is full after ``POOL / 64`` steps, in the second epoch at the quick
sizes; memory is flat after. A correct verdict is bounded (a plateau), not a leak. Twin:
``fix_patch_pool_fills`` (a pool of 640 patches, full within the warm-up).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/JDAI-CV/fast-reid/issues/673"
IMAGE = (3, 64, 32)  # C, H, W; uint8: 6 KiB
FILL_STEPS = 200
IMAGES = 1024  # the training set, in memory: 6 MiB
POOL = FILL_STEPS * BATCH  # one patch per image: full at step 200

SCENARIO = Scenario(
    name="rep_patch_pool_fills",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="fast-reid#673: RandomPatch's deque(maxlen=12800) patch pool fills, then flat",
    expected_kind="bounded",
    source=SOURCE,
    reported=True,
    growth="stops",
    stops_at_step=FILL_STEPS,
)


class RandomPatch:
    """Crop a patch from every image into a bounded pool; paste pool patches onto images."""

    def __init__(self, pool_capacity: int, prob_happen: float = 0.5, min_sample_size: int = 100,
                 patch_min_area: float = 0.01, patch_max_area: float = 0.5,
                 patch_min_ratio: float = 0.1, seed: int = 0) -> None:
        self.patchpool: deque[np.ndarray] = deque(maxlen=pool_capacity)
        self.prob_happen = prob_happen
        self.min_sample_size = min_sample_size
        self.patch_min_area = patch_min_area
        self.patch_max_area = patch_max_area
        self.patch_min_ratio = patch_min_ratio
        self.rng = random.Random(seed)

    def generate_wh(self, width: int, height: int) -> tuple[int, int] | tuple[None, None]:
        area = width * height
        for _ in range(100):
            target = self.rng.uniform(self.patch_min_area, self.patch_max_area) * area
            ratio = self.rng.uniform(self.patch_min_ratio, 1.0 / self.patch_min_ratio)
            h, w = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if w < width and h < height:
                return w, h
        return None, None

    def __call__(self, img: np.ndarray) -> np.ndarray:
        _, height, width = img.shape
        w, h = self.generate_wh(width, height)
        if w is not None and h is not None:
            x1, y1 = self.rng.randint(0, width - w), self.rng.randint(0, height - h)
            self.patchpool.append(img[:, y1:y1 + h, x1:x1 + w].copy())  # the pool grows here
        if len(self.patchpool) < self.min_sample_size or self.rng.random() > self.prob_happen:
            return img
        patch = self.patchpool[self.rng.randrange(len(self.patchpool))]
        _, ph, pw = patch.shape
        x1, y1 = self.rng.randint(0, width - pw), self.rng.randint(0, height - ph)
        img[:, y1:y1 + ph, x1:x1 + pw] = patch  # pasted in place, as PIL's Image.paste does
        return img


def _run(mw: Any, epochs: int, steps_per_epoch: int, pool_capacity: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    transform = RandomPatch(pool_capacity)
    rng = np.random.default_rng(0)
    # The decoded training images (Market-1501-like crops), read in order, batch by batch.
    images = rng.integers(0, 256, size=(IMAGES, *IMAGE), dtype=np.uint8)
    batch = np.empty((BATCH, *IMAGE), dtype=np.uint8)
    stride = math.prod(IMAGE) // IN_DIM

    def step(epoch: int, i: int) -> None:
        start = (epoch * steps_per_epoch + i) * BATCH % IMAGES
        for k in range(BATCH):
            batch[k] = images[start + k]  # "decoded" into the batch, then augmented in place
            transform(batch[k])
        flat = batch.reshape(BATCH, -1)[:, ::stride][:, :IN_DIM]
        x = torch.from_numpy(flat.astype(np.float32) / 255.0)
        y = torch.from_numpy(rng.integers(0, CLASSES, size=BATCH))
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, pool_capacity=POOL)
