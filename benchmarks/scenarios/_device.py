"""Scripted device series on :class:`memwatch.testing.FakeDevice` (no torch needed).

A scripted step sets the counters twice: once at the step's peak (weights + leaked memory +
activations), once after the step (activations freed), then samples, so ``device.peak`` sees the
peak and ``device.allocated`` the floor, as on a real GPU sampled after ``optimizer.step()``.
``device.reserved`` follows the caching allocator: the peak rounded up to 20 MiB segments, never
given back (no ``empty_cache()``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
SEGMENT = 20 * MiB


def first_step_at_or_above(limit: float, peak_at: Callable[[int], float], start: int = 1,
                           horizon: int = 10**7) -> int:
    """The first step whose (noise-free) peak reaches ``limit``: the true OOM step."""
    lo, hi = start, horizon
    # Peaks of the leak scenarios are non-decreasing in the step, so bisection is exact.
    while lo < hi:
        mid = (lo + hi) // 2
        if peak_at(mid) >= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


def run_scripted(mw: Any, epochs: int, steps_per_epoch: int,
                 floor_at: Callable[[int, int, int], float], activations: float,
                 noise: float = 0.0, seed: int = 0) -> list[list[Any]]:
    """Drive ``mw.device`` (a FakeDevice) with ``floor_at(step, epoch, i)`` plus Gaussian noise.

    ``step`` counts from 1 over the whole run; ``activations`` is what one step adds at its peak.
    """
    dev = mw.device
    rng = random.Random(seed)
    reserved = 0
    step = 0
    findings: list[list[Any]] = []
    for epoch in range(epochs):
        for i in range(steps_per_epoch):
            step += 1
            floor = max(0.0, floor_at(step, epoch, i) + (rng.gauss(0.0, noise) if noise else 0.0))
            peak = floor + activations
            reserved = max(reserved, int(math.ceil(peak / SEGMENT)) * SEGMENT)
            dev.set(allocated=int(peak), reserved=reserved)
            dev.set(allocated=int(floor), reserved=reserved)
            mw.step()
        findings.append(mw.end_epoch())
    return findings
