"""CUDA and ROCm device probe.

This is the only module that touches private torch APIs (``torch._C._cuda_memoryStats``, the
allocator's out-of-memory observer, ``_record_memory_history`` and ``_snapshot``); each use is
guarded by a feature check so an older or newer torch degrades to the public API or to "not
available" instead of failing.

Per step it reads the caching allocator's counters: host-side bookkeeping, no device
synchronisation. ``mem_get_info`` and NVML are read only from the background thread.

The counters' one call, ``torch._C._cuda_memoryStats``, builds a nested dict of every statistic
(~100 entries): 9.9 us median on an H100 host (torch 2.11; ``torch.cuda.memory_allocated()``,
which flattens that dict, 63 us). No lighter read exists, so the hot path reads it at most every
:data:`FAST_MIN_INTERVAL_S` (the session repeats the last values between reads): in a loop of
short steps the read costs at most ~0.12% of wall time, and a step of 10 ms or more is read every
time. The window peak between two reads is still the allocator's high-water mark.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from memwatch.probes.base import (
    DEVICE_FAST_KEYS,
    DEVICE_SLOW_KEYS,
    OOMObserver,
    WindowPeak,
    outside_allocator,
    private_pools,
)

log = logging.getLogger("memwatch")

#: The least time between two reads of the allocator's counters on the hot path: 11.8 us of the
#: probe's read (H100, torch 2.11) in 10 ms is 0.12% of wall time at most.
FAST_MIN_INTERVAL_S = 0.010

# The CUDA allocator has no way to detach an OOM observer, so memwatch attaches one trampoline per
# process and points it at whichever observer is current.
_observer_lock = threading.Lock()
_current_observer: OOMObserver | None = None
_trampoline_attached = False


def _trampoline(device: int, alloc: int, device_total: int, device_free: int) -> None:
    obs = _current_observer
    if obs is not None:
        try:
            obs(device, alloc, device_total, device_free)
        except Exception:  # noqa: BLE001 - an observer must never turn an OOM into another error
            log.exception("memwatch: OOM observer failed")


def _nested_get(d: Any, *path: str, default: float = 0.0) -> float:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return float(d)


class CudaProbe:
    """Caching-allocator counters of one CUDA (or ROCm) device."""

    name = "device"
    fast_keys: tuple[str, ...] = DEVICE_FAST_KEYS
    slow_keys: tuple[str, ...] = DEVICE_SLOW_KEYS
    fast_min_interval_s = FAST_MIN_INTERVAL_S

    def __init__(self, index: int | None = None, use_nvml: bool = True) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        self._torch = torch
        self.index = torch.cuda.current_device() if index is None else int(index)
        self.kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        self._peak = WindowPeak()
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        self._stats: Callable[[], Any]
        if raw is not None:
            self._stats = lambda: raw(self.index)
        else:  # public, slightly slower
            self._stats = lambda: torch.cuda.memory_stats_as_nested_dict(self.index)
        self._total: int | None = None
        self._nvml: Any = None
        self.outside_source = "none"  # how device.outside_allocator is measured
        self._nvml_handle: Any = None
        if use_nvml and self.kind == "cuda":
            self._init_nvml()

    def _init_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(self._torch.cuda.get_device_properties(self.index).uuid)
            uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            self._nvml_handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - NVML is optional (nvidia-ml-py not installed, no driver)
            self._nvml = None

    def read_fast(self) -> Sequence[float]:
        s = self._stats()
        try:  # the layout every torch since 1.x has; the guarded walk below is for any other
            ab = s["allocated_bytes"]["all"]
            allocated, hw = float(ab["current"]), float(ab["peak"])
            return (allocated, float(s["reserved_bytes"]["all"]["current"]),
                    float(s["active_bytes"]["all"]["current"]), self._peak.update(allocated, hw),
                    float(s["inactive_split_bytes"]["all"]["current"]),
                    float(s["num_alloc_retries"]), float(s["num_ooms"]))
        except (KeyError, TypeError, ValueError):
            pass
        allocated = _nested_get(s, "allocated_bytes", "all", "current")
        hw = _nested_get(s, "allocated_bytes", "all", "peak")
        return (
            allocated,
            _nested_get(s, "reserved_bytes", "all", "current"),
            _nested_get(s, "active_bytes", "all", "current"),
            self._peak.update(allocated, hw),
            _nested_get(s, "inactive_split_bytes", "all", "current"),
            float(s.get("num_alloc_retries", 0)),
            float(s.get("num_ooms", 0)),
        )

    def read_slow(self) -> dict[str, float]:
        free, total = self._torch.cuda.mem_get_info(self.index)
        self._total = int(total)
        out = {"device.free": float(free), "device.total": float(total)}
        stats = self._stats()
        out["device.private_pools"] = private_pools(stats)
        reserved = _nested_get(stats, "reserved_bytes", "all", "current")
        if self._nvml is not None:
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._nvml_handle)
                out["device.used"] = float(info.used)
                import os

                me = os.getpid()
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._nvml_handle):
                    if p.pid == me and p.usedGpuMemory is not None:
                        out["device.process_used"] = float(p.usedGpuMemory)
            except Exception:  # noqa: BLE001
                log.warning("memwatch: NVML read failed; NVML metrics disabled", exc_info=True)
                self._nvml = None
        outside, self.outside_source = outside_allocator(
            reserved, out.get("device.process_used"), float(free), float(total))
        if outside is not None:
            out["device.outside_allocator"] = outside
        return out

    def total_bytes(self) -> int | None:
        if self._total is None:
            self._total = int(self._torch.cuda.get_device_properties(self.index).total_memory)
        return self._total

    def limits(self) -> dict[str, float]:
        total = self.total_bytes()
        if total is None:
            return {}
        return {k: float(total) for k in ("device.allocated", "device.reserved", "device.peak",
                                          "device.active")}

    def memory_stats(self) -> dict[str, Any]:
        return dict(self._torch.cuda.memory_stats(self.index))

    def attach_oom_observer(self, observer: OOMObserver) -> bool:
        global _current_observer, _trampoline_attached
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return False
        with _observer_lock:
            if not _trampoline_attached:
                attach(_trampoline)
                _trampoline_attached = True
            _current_observer = observer
        return True

    def detach_oom_observer(self) -> None:
        global _current_observer
        with _observer_lock:
            _current_observer = None

    def empty_cache(self) -> None:
        self._torch.cuda.empty_cache()

    def snapshot(self) -> Any | None:
        """The allocator snapshot (segments, blocks and, if recording, the history)."""
        fn = getattr(self._torch.cuda.memory, "_snapshot", None)
        return fn(self.index) if fn is not None else None

    def record_history(self, enabled: bool, max_entries: int = 100_000) -> bool:
        """Turn allocation-history recording on/off (opt-in: it costs a stack walk per alloc)."""
        fn = getattr(self._torch.cuda.memory, "_record_memory_history", None)
        if fn is None:
            return False
        if enabled:
            fn(enabled="all", context="alloc", stacks="python", max_entries=max_entries)
        else:
            fn(enabled=None)
        return True

    def describe(self) -> dict[str, Any]:
        props = self._torch.cuda.get_device_properties(self.index)
        return {
            "kind": self.kind,
            "index": self.index,
            "name": props.name,
            "total_bytes": int(props.total_memory),
            "torch_cuda": getattr(self._torch.version, "cuda", None),
            "torch_hip": getattr(self._torch.version, "hip", None),
            "outside_allocator_source": self.outside_source,
            "private_pools_source": "memory_stats" if isinstance(
                self._stats().get("reserved_bytes_by_private_pools"), dict)
            else "not measured: this torch's memory_stats has no reserved_bytes_by_private_pools",
            "fast_min_interval_s": self.fast_min_interval_s,
        }

    def close(self) -> None:
        self.detach_oom_observer()
