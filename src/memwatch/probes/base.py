"""The probe protocol.

A probe owns a few metrics. ``read_fast`` is called on the training thread once per optimizer step
and must only read counters that never synchronise a device (O(1), microseconds). ``read_slow`` is
called from the background sampler thread (about once a second) and at epoch ends; it may cost
milliseconds (``/proc/<pid>/smaps_rollup``, ``cudaMemGetInfo``, NVML).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

#: Signature of an out-of-memory observer, the same as the CUDA caching allocator's:
#: ``observer(device_index, bytes_requested, device_allocated, device_free)``.
OOMObserver = Callable[[int, int, int, int], None]


@runtime_checkable
class Probe(Protocol):
    """Anything that contributes metrics to the timeline."""

    name: str
    fast_keys: tuple[str, ...]
    slow_keys: tuple[str, ...]

    def read_fast(self) -> Sequence[float]:
        """Values for ``fast_keys``, in order. Hot path: no I/O beyond a ``pread``, no sync."""
        ...

    def read_slow(self) -> dict[str, float]:
        """Values for (a subset of) ``slow_keys``. Background thread or epoch end only."""
        ...

    def limits(self) -> dict[str, float]:
        """Byte limits per metric (device total, cgroup memory) where one is known."""
        ...

    def close(self) -> None:
        """Release file descriptors and observers. Idempotent."""
        ...


@runtime_checkable
class DeviceProbe(Probe, Protocol):
    """An accelerator: CUDA/ROCm, MPS, or :class:`memwatch.testing.FakeDevice`.

    ``fast_keys`` is a subset of :data:`DEVICE_FAST_KEYS`.
    """

    kind: str  # "cuda", "rocm", "mps", "fake"
    index: int

    def total_bytes(self) -> int | None:
        """Device capacity in bytes, when known."""
        ...

    def memory_stats(self) -> dict[str, Any]:
        """Full allocator statistics (flat dict), for bundles. Not for the hot path."""
        ...

    def attach_oom_observer(self, observer: OOMObserver) -> bool:
        """Call ``observer`` before an OOM is raised (stack not yet unwound). True if attached."""
        ...

    def detach_oom_observer(self) -> None:
        """Stop forwarding OOM events to the observer attached last."""
        ...

    def empty_cache(self) -> None:
        """Release cached, unallocated blocks back to the device."""
        ...

    def describe(self) -> dict[str, Any]:
        """Name, capacity and versions, for bundles and environment reports."""
        ...


DEVICE_FAST_KEYS: tuple[str, ...] = (
    "device.allocated",
    "device.reserved",
    "device.active",
    "device.peak",
    "device.inactive_split",
    "device.alloc_retries",
    "device.ooms",
)
DEVICE_SLOW_KEYS: tuple[str, ...] = (
    "device.free",
    "device.total",
    "device.used",
    "device.process_used",
    "device.outside_allocator",
    "device.private_pools",
)


def outside_allocator(reserved: float, process_used: float | None, free: float | None,
                      total: float | None) -> tuple[float | None, str]:
    """Device memory of this process that the caching allocator does not hold: the CUDA
    context, cuBLAS/cuDNN workspaces, NCCL buffers, other libraries' ``cudaMalloc``. From the
    driver's per-process figure (NVML) when there is one, else from the device-wide use
    (``total - free``: exact when this process is the device's only user). (bytes, source)."""
    if process_used is not None:
        return max(process_used - reserved, 0.0), "nvml_process"
    if free is not None and total is not None:
        return max(total - free - reserved, 0.0), "device_wide"
    return None, "none"


def private_pools(stats: Any) -> float:
    """Bytes reserved by the allocator's private pools (CUDA graphs, ``torch.compile(mode=
    "reduce-overhead")``, ``MemPool``): ``reserved_bytes_by_private_pools`` of the nested
    ``memory_stats``, summed over pools. NaN (not measured) where the torch build has no such
    key: torch 2.11 has none (an H100 run with a CUDA graph alive read no pool,
    docs/gpu-verification.md); 2.13 documents it. Its only other source, the allocator snapshot,
    walks every block under the allocator's lock: too dear for a periodic read."""
    pools = stats.get("reserved_bytes_by_private_pools") if isinstance(stats, dict) else None
    if not isinstance(pools, dict):
        return float("nan")
    total = 0.0
    for v in pools.values():
        try:
            total += float(v["all"]["current"])
        except (KeyError, TypeError, ValueError):
            continue
    return total


class WindowPeak:
    """Peak allocated bytes since the previous step, without resetting the allocator's peak.

    Other code relies on ``max_memory_allocated`` (and transformers' memory tracker resets it), so
    memwatch never resets it. Instead: if the allocator's high-water mark moved since the last read
    (up, or down because somebody reset it), the new mark is this window's peak; otherwise the
    window never exceeded the old mark and the best honest figure is the current allocation.
    """

    __slots__ = ("_last_hw",)

    def __init__(self) -> None:
        self._last_hw = -1.0

    def update(self, allocated: float, high_water: float) -> float:
        if high_water != self._last_hw:
            self._last_hw = high_water
            return max(high_water, allocated)
        return allocated
