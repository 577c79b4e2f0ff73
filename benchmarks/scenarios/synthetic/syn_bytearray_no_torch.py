"""Synthetic leak without torch: a pure-Python loop keeps a 64 KiB ``bytearray`` every step.

Not from a thread. The module imports neither torch nor numpy (nor ``_common``): the "model" is
a logistic regression on Python floats trained by plain SGD, and every step it keeps a
``bytearray`` snapshot of its batch (64 KiB, as a debugging dump would) in the module global
``debug_frames``. Only the ``mw`` object connects it to memwatch; whether torch ends up imported
in the process is up to memwatch (reported/README.md records it).
"""

from __future__ import annotations

import math
import random
from typing import Any

from .. import Scenario

FRAME_BYTES = 64 * 1024
FEATURES = 16
SAMPLES = 128  # per mini-batch: ~2 ms of pure Python per step

SCENARIO = Scenario(
    name="syn_bytearray_no_torch",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="debug_frames",
    description="synthetic, no torch: pure-Python SGD keeps a 64 KiB bytearray per step",
    planted_bytes_per_step=FRAME_BYTES + 57,  # payload and bytearray object (+ its NUL)
)

debug_frames: list[bytearray] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    rng = random.Random(0)
    true_w = [rng.uniform(-1, 1) for _ in range(FEATURES)]
    w = [0.0] * FEATURES
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            grad = [0.0] * FEATURES
            for _ in range(SAMPLES):
                x = [rng.gauss(0.0, 1.0) for _ in range(FEATURES)]
                y = 1.0 if sum(a * b for a, b in zip(true_w, x, strict=True)) > 0 else 0.0
                z = sum(a * b for a, b in zip(w, x, strict=True))
                p = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
                for k in range(FEATURES):
                    grad[k] += (p - y) * x[k] / SAMPLES
            w = [a - 0.1 * g for a, g in zip(w, grad, strict=True)]
            frame = bytearray(FRAME_BYTES)
            frame[: 8 * FEATURES] = b"".join(int(abs(v) * 1e6).to_bytes(8, "little") for v in w)
            debug_frames.append(frame)  # the bug: every snapshot kept
            mw.step()
        findings.append(mw.end_epoch())
    return findings
