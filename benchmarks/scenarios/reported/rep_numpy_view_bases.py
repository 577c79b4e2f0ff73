"""Reported leak: short slices of large numpy arrays kept in a list keep the whole arrays alive.

Thread: https://github.com/numpy/numpy/issues/15746 ("Memory leak when using slice array in
loop"). A loop that loaded a sound at every iteration, sliced its first samples and appended the
slice to a list used "huge amounts of memory". The maintainer's answer: by design, a slice is a
view that keeps the original array in its ``.base``, so every kept slice keeps its whole array;
"Your memory leak will go away if you put ``s_slice.copy()`` in the ``accum`` array" (the same
answer as numpy#10273 and #19091). Labelled a leak of the user's loop: the list keeps growing by
whole arrays while it looks like it keeps only short slices.

Reproduction: an audio classifier trained on batches of 64 clips of 256 samples (``float32``,
one 64 KiB numpy array per batch, as a loader decodes it). To log audio previews at the end of
training, the loop keeps the first ``PREVIEW`` samples of the 4 loudest clips of every batch in
the module list ``preview_clips``: 4 views of 256 bytes each that share one 64 KiB base, so the
list adds about 64 KiB a step (once per base, not once per view). Fixed twin:
``fix_numpy_view_bases`` (``.copy()`` of each slice: 1 KiB a step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/numpy/numpy/issues/15746"
PREVIEW = 64  # samples kept per preview
KEEP = 4  # previews per batch

SCENARIO = Scenario(
    name="rep_numpy_view_bases",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="preview_clips",
    description="numpy#15746: 4 short views per batch kept in a list, each pins its 64 KiB base",
    # One 64 KiB base per step (the 4 views share it) and 4 view objects.
    planted_bytes_per_step=BATCH * IN_DIM * 4 + KEEP * 112,
    source=SOURCE,
    reported=True,
)

preview_clips: list[np.ndarray] = []


def _run(mw: Any, epochs: int, steps_per_epoch: int, copy: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    preview_clips.clear()

    def step(epoch: int, i: int) -> None:
        clips = rng.standard_normal((BATCH, IN_DIM), dtype=np.float32)  # one decoded batch
        labels = rng.integers(0, CLASSES, size=BATCH)
        for k in np.argsort(-np.abs(clips).max(axis=1))[:KEEP]:
            preview = clips[k, :PREVIEW]  # a view: its .base is the whole batch
            preview_clips.append(preview.copy() if copy else preview)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(torch.from_numpy(clips)),
                                    torch.from_numpy(labels)).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, copy=False)
