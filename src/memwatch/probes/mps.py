"""Apple MPS device probe: current allocated, driver allocated and the recommended maximum."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memwatch.probes.base import OOMObserver, WindowPeak


class MpsProbe:
    name = "device"
    kind = "mps"
    index = 0
    fast_keys: tuple[str, ...] = ("device.allocated", "device.reserved", "device.peak")
    slow_keys: tuple[str, ...] = ("device.total",)

    def __init__(self) -> None:
        import torch

        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise RuntimeError("MPS is not available")
        self._mps = torch.mps
        self._peak = WindowPeak()
        self._hw = 0.0

    def read_fast(self) -> Sequence[float]:
        allocated = float(self._mps.current_allocated_memory())
        # MPS keeps no high-water mark of its own: track one (per step, so a lower bound).
        self._hw = max(self._hw, allocated)
        return (allocated, float(self._mps.driver_allocated_memory()),
                self._peak.update(allocated, self._hw))

    def read_slow(self) -> dict[str, float]:
        t = self.total_bytes()
        return {"device.total": float(t)} if t else {}

    def total_bytes(self) -> int | None:
        fn = getattr(self._mps, "recommended_max_memory", None)
        return int(fn()) if fn is not None else None

    def limits(self) -> dict[str, float]:
        t = self.total_bytes()
        return {"device.allocated": float(t), "device.reserved": float(t)} if t else {}

    def memory_stats(self) -> dict[str, Any]:
        return {
            "current_allocated_memory": int(self._mps.current_allocated_memory()),
            "driver_allocated_memory": int(self._mps.driver_allocated_memory()),
            "recommended_max_memory": self.total_bytes(),
        }

    def attach_oom_observer(self, observer: OOMObserver) -> bool:
        return False  # MPS has no allocator OOM observer: bundles are captured on the exception

    def detach_oom_observer(self) -> None:
        return None

    def empty_cache(self) -> None:
        self._mps.empty_cache()

    def describe(self) -> dict[str, Any]:
        return {"kind": "mps", "index": 0, "name": "Apple MPS", "total_bytes": self.total_bytes()}

    def close(self) -> None:
        return None
