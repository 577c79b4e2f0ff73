"""A scripted leak on a FakeDevice, shared by the sink tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memwatch
from memwatch.testing import FakeDevice

GIB, MIB = 1 << 30, 1 << 20


def leak_run(tmp_path: Path, sinks: list[Any], epochs: int = 3, steps: int = 100,
             every: int = 25, oom: bool = False, stop_after: int | None = None,
             after_step: Callable[[int], None] | None = None, **kw: Any) -> memwatch.MemWatch:
    """A FakeDevice run leaking 2 MiB per step (a leak verdict from the second epoch end);
    ``stop_after``: the leak stops after that many epochs; ``after_step(step)`` after each
    step (the trainer's own logging, say)."""
    dev = FakeDevice(total_bytes=8 * GIB)
    rng = np.random.default_rng(0)
    last = None if stop_after is None else stop_after * steps
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=str(tmp_path / "mw"),
                        census="never", sinks=sinks, log_every_n_steps=every, **kw) as mw:
        s = 0
        for _ in range(epochs):
            for _ in range(steps):
                held = s if last is None else min(s, last)
                dev.set(allocated=int(GIB + held * 2 * MIB + rng.normal(0, 1e5)))
                mw.step()
                s += 1
                if after_step is not None:
                    after_step(s)
            mw.end_epoch()
        if oom:
            with pytest.raises(Exception) as ei:  # noqa: PT011 - torch's OOM type
                with mw.capture_oom():
                    dev.malloc(16 * GIB)
            assert ei.value.memwatch_bundle is not None  # type: ignore[attr-defined]
    return mw
