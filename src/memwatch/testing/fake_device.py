"""Test doubles that ship with memwatch, for its own tests, its docs and users' tests.

:class:`FakeDevice` implements the device-probe protocol with a small simulation of PyTorch's CUDA
caching allocator, so CUDA-only paths (allocator counters, fragmentation, OOM observers, bundles
captured before the stack unwinds) run on a CPU-only machine.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Sequence
from typing import Any

from memwatch.core.errors import FakeOutOfMemoryError
from memwatch.probes.base import (
    DEVICE_FAST_KEYS,
    OOMObserver,
    WindowPeak,
    outside_allocator,
    private_pools,
)

__all__ = ["FakeDevice", "format_size", "malloc_trim"]

# The real allocator's constants (c10/cuda/CUDACachingAllocator.cpp).
_MIN_BLOCK = 512  # every request is rounded up to a multiple of this
_SMALL_SIZE = 1 << 20  # requests up to 1 MiB come from the small pool
_SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB
_LARGE_BUFFER = 20 << 20  # requests of 1-10 MiB get a 20 MiB segment
_MIN_LARGE_ALLOC = 10 << 20  # from 10 MiB, segments are the request rounded up to 2 MiB
_ROUND_LARGE = 2 << 20


def format_size(n: float) -> str:
    """Size as the CUDA allocator prints it in its OOM message."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


@dataclasses.dataclass
class _Block:
    offset: int
    size: int
    allocated: bool = False
    requested: int = 0
    frames: list[dict[str, Any]] | None = None  # with record_history: where it was allocated


@dataclasses.dataclass
class _Segment:
    address: int
    size: int
    small: bool
    blocks: list[_Block]

    @property
    def allocated_size(self) -> int:
        return sum(b.size for b in self.blocks if b.allocated)


class FakeDevice:
    """A scripted accelerator with a simulated caching allocator.

    Two ways to drive it, and they add up:

    * ``set(allocated=..., reserved=..., active=None)`` scripts the counters directly
      (series for analyzer tests);
    * ``malloc(nbytes) -> handle`` / ``free(handle)`` / ``empty_cache()`` run a small model of
      PyTorch's caching allocator (512-byte rounding, 2 MiB small-pool segments, 20 MiB segments
      for 1-10 MiB requests, block splitting and coalescing), so reserved and allocated diverge the
      way they do on a real GPU.

    An allocation that does not fit first releases cached segments and retries (counted in
    ``device.alloc_retries``), then calls every registered OOM observer — before anything unwinds,
    as the real allocator does — and raises ``torch.OutOfMemoryError`` (a
    :class:`memwatch.core.errors.FakeOutOfMemoryError` when torch is not importable) with a
    CUDA-style message.

    Example::

        >>> from memwatch.testing import FakeDevice
        >>> dev = FakeDevice(total_bytes=64 * 2**20)
        >>> h = dev.malloc(3 * 2**20)          # a 3 MiB tensor gets a 20 MiB segment
        >>> dev.allocated, dev.reserved
        (3145728, 20971520)
        >>> dev.free(h); dev.empty_cache(); dev.reserved
        0
    """

    name = "device"
    kind = "fake"
    fast_keys: tuple[str, ...] = DEVICE_FAST_KEYS
    slow_keys: tuple[str, ...] = ("device.free", "device.total", "device.outside_allocator",
                                  "device.private_pools")
    #: 0: the counters are read at every step. Set it (CudaProbe's is 0.010) to rehearse the
    #: CUDA probe's gate: the session then reads them at most that often.
    fast_min_interval_s = 0.0

    def __init__(self, total_bytes: int = 16 << 30, index: int = 0, name: str = "FakeGPU") -> None:
        if total_bytes <= 0:
            raise ValueError(f"FakeDevice(total_bytes=...) must be positive, got {total_bytes}")
        self.total = int(total_bytes)
        self.index = index
        self.device_name = name
        self._segments: list[_Segment] = []
        self._handles: dict[int, tuple[_Segment, _Block]] = {}
        self._ids = itertools.count(1)
        self._addr = itertools.count(0x7F0000000000, 1 << 32)
        self._sim_allocated = 0
        self._sim_reserved = 0
        self._script_allocated = 0
        self._script_reserved = 0
        self._script_active: int | None = None
        self._high_water = 0
        self._window = WindowPeak()
        self.alloc_retries = 0
        self.ooms = 0
        self._observers: list[OOMObserver] = []
        self.closed = False
        #: scripted: device memory of this process outside the caching allocator (a CUDA
        #: context, cuBLAS workspaces, NCCL buffers), as NVML would report it less reserved
        self.outside_bytes = 0
        #: scripted: bytes the allocator reserves in private pools (CUDA graphs), keyed by pool
        self.private_pool_bytes: dict[str, int] = {}
        self.recording = False  # record_history(True) was called: blocks keep their frames

    # ----------------------------------------------------------------- scripted counters
    def set(self, allocated: int, reserved: int | None = None, active: int | None = None) -> None:
        """Script the counters (added to whatever the simulated allocator holds)."""
        if allocated < 0:
            raise ValueError("FakeDevice.set(allocated=...) must be >= 0")
        self._script_allocated = int(allocated)
        self._script_reserved = int(max(reserved if reserved is not None else 0, allocated))
        self._script_active = None if active is None else int(active)
        self._high_water = max(self._high_water, self.allocated)

    def reset_peak(self) -> None:
        """What ``torch.cuda.reset_peak_memory_stats`` does (transformers' tracker calls it)."""
        self._high_water = self.allocated

    # ----------------------------------------------------------------- simulated allocator
    @property
    def allocated(self) -> int:
        return self._script_allocated + self._sim_allocated

    @property
    def reserved(self) -> int:
        return self._script_reserved + self._sim_reserved

    @property
    def active(self) -> int:
        if self._script_active is not None:
            return self._script_active + self._sim_allocated
        return self.allocated

    @property
    def max_allocated(self) -> int:
        return self._high_water

    @property
    def inactive_split(self) -> int:
        total = 0
        for seg in self._segments:
            if any(b.allocated for b in seg.blocks):
                total += sum(b.size for b in seg.blocks if not b.allocated)
        return total

    def malloc(self, nbytes: int, frames: list[dict[str, Any]] | None = None) -> int:
        """Allocate ``nbytes``; returns a handle for :meth:`free`. While :meth:`record_history`
        is on, the block keeps ``frames`` (``{"filename", "line", "name"}``, innermost first,
        as the real snapshot's) or, by default, the caller's Python stack."""
        if nbytes <= 0:
            raise ValueError("FakeDevice.malloc(nbytes) needs nbytes > 0")
        size = -(-int(nbytes) // _MIN_BLOCK) * _MIN_BLOCK
        small = size <= _SMALL_SIZE
        found = self._best_fit(size, small)
        if found is None:
            seg_size = self._segment_size(size)
            if self.reserved + seg_size > self.total:
                # What the real allocator does before giving up: free cached blocks, retry.
                self.alloc_retries += 1
                self.empty_cache()
            if self.reserved + seg_size > self.total:
                self._raise_oom(size)
            seg = _Segment(next(self._addr), seg_size, small, [_Block(0, seg_size)])
            self._segments.append(seg)
            self._sim_reserved += seg_size
            found = (seg, seg.blocks[0])
        seg, block = found
        remaining = block.size - size
        can_split = remaining >= _MIN_BLOCK if small else remaining > _SMALL_SIZE
        if can_split:
            rest = _Block(block.offset + size, remaining)
            block.size = size
            seg.blocks.insert(seg.blocks.index(block) + 1, rest)
        block.allocated = True
        block.requested = int(nbytes)
        block.frames = (frames if frames is not None else _stack()) if self.recording else None
        self._sim_allocated += block.size
        self._high_water = max(self._high_water, self.allocated)
        handle = next(self._ids)
        self._handles[handle] = (seg, block)
        return handle

    def address_of(self, handle: int) -> int:
        """The device address of a live allocation (a tensor's ``data_ptr()``)."""
        seg, block = self._handles[handle]
        return seg.address + block.offset

    def free(self, handle: int) -> None:
        """Return a block to the cache (reserved does not shrink; see :meth:`empty_cache`)."""
        try:
            seg, block = self._handles.pop(handle)
        except KeyError:
            raise ValueError(f"FakeDevice.free: unknown or already freed handle {handle}") from None
        block.allocated = False
        self._sim_allocated -= block.size
        # Coalesce with free neighbours, as the real allocator merges adjacent free blocks.
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and not seg.blocks[i + 1].allocated:
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and not seg.blocks[i - 1].allocated:
            prev = seg.blocks[i - 1]
            prev.size += block.size
            seg.blocks.pop(i)

    def empty_cache(self) -> None:
        """Release every segment with no allocated block."""
        keep = []
        for seg in self._segments:
            if any(b.allocated for b in seg.blocks):
                keep.append(seg)
            else:
                self._sim_reserved -= seg.size
        self._segments = keep

    def _best_fit(self, size: int, small: bool) -> tuple[_Segment, _Block] | None:
        best: tuple[_Segment, _Block] | None = None
        for seg in self._segments:
            if seg.small != small:
                continue
            for b in seg.blocks:
                if not b.allocated and b.size >= size and (best is None or b.size < best[1].size):
                    best = (seg, b)
        return best

    @staticmethod
    def _segment_size(size: int) -> int:
        if size <= _SMALL_SIZE:
            return _SMALL_BUFFER
        if size < _MIN_LARGE_ALLOC:
            return _LARGE_BUFFER
        return -(-size // _ROUND_LARGE) * _ROUND_LARGE

    def _raise_oom(self, size: int) -> None:
        self.ooms += 1
        free = self.total - self.reserved
        for obs in list(self._observers):
            # Same arguments as the CUDA allocator: device, request, device total, device free.
            obs(self.index, size, self.total, free)
        msg = (
            f"CUDA out of memory. Tried to allocate {format_size(size)}. GPU {self.index} has a "
            f"total capacity of {format_size(self.total)} of which {format_size(free)} is free. "
            f"Including non-PyTorch memory, this process has {format_size(self.reserved)} memory "
            f"in use. Of the allocated memory {format_size(self.allocated)} is allocated by "
            f"PyTorch, and {format_size(self.reserved - self.allocated)} is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )
        raise _oom_error(msg)

    # ----------------------------------------------------------------- probe protocol
    def read_fast(self) -> Sequence[float]:
        allocated = self.allocated
        return (
            float(allocated),
            float(self.reserved),
            float(self.active),
            float(self._window.update(allocated, self._high_water)),
            float(self.inactive_split) if self._segments else 0.0,
            float(self.alloc_retries),
            float(self.ooms),
        )

    def read_slow(self) -> dict[str, float]:
        free = float(self.total - self.reserved - self.outside_bytes)
        outside, _ = outside_allocator(float(self.reserved), None, free, float(self.total))
        return {"device.free": free, "device.total": float(self.total),
                "device.outside_allocator": float(outside or 0.0),
                "device.private_pools": private_pools(self.nested_stats())}

    def nested_stats(self) -> dict[str, Any]:
        """The parts of ``memory_stats_as_nested_dict()`` memwatch reads in the background."""
        return {"reserved_bytes": {"all": {"current": self.reserved}},
                "reserved_bytes_by_private_pools": {
                    k: {"all": {"current": v}} for k, v in self.private_pool_bytes.items()}}

    def record_history(self, enabled: bool, max_entries: int = 100_000) -> bool:
        self.recording = bool(enabled)
        return True

    def total_bytes(self) -> int | None:
        return self.total

    def limits(self) -> dict[str, float]:
        t = float(self.total)
        return {"device.allocated": t, "device.reserved": t, "device.peak": t, "device.active": t}

    def memory_stats(self) -> dict[str, Any]:
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self._high_water,
            "reserved_bytes.all.current": self.reserved,
            "active_bytes.all.current": self.active,
            "inactive_split_bytes.all.current": self.inactive_split,
            "num_alloc_retries": self.alloc_retries,
            "num_ooms": self.ooms,
            "segment.all.current": len(self._segments),
            "allocation.all.current": len(self._handles),
        }

    def snapshot(self) -> dict[str, Any]:
        """Segments and blocks in the shape of ``torch.cuda.memory._snapshot()``."""
        segs = []
        for seg in self._segments:
            blocks = [
                {
                    "address": seg.address + b.offset,
                    "size": b.size,
                    "requested_size": b.requested if b.allocated else 0,
                    "state": "active_allocated" if b.allocated else "inactive",
                    **({"frames": b.frames} if b.frames is not None else {}),
                }
                for b in seg.blocks
            ]
            segs.append(
                {
                    "device": self.index,
                    "address": seg.address,
                    "total_size": seg.size,
                    "allocated_size": seg.allocated_size,
                    "active_size": seg.allocated_size,
                    "segment_type": "small" if seg.small else "large",
                    "blocks": blocks,
                }
            )
        return {"segments": segs, "device_traces": [[]]}

    def attach_oom_observer(self, observer: OOMObserver) -> bool:
        self._observers.append(observer)
        return True

    def detach_oom_observer(self) -> None:
        if self._observers:
            self._observers.pop()

    def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "index": self.index, "name": self.device_name,
                "total_bytes": self.total}

    def close(self) -> None:
        self.closed = True


def _stack(limit: int = 8) -> list[dict[str, Any]]:
    """The caller's frames outside this module, innermost first, in the snapshot's shape."""
    out: list[dict[str, Any]] = []
    f = sys._getframe(2)
    while f is not None and len(out) < limit:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno,
                    "name": f.f_code.co_name})
        f = f.f_back  # type: ignore[assignment]
    return out


def _oom_error(msg: str) -> BaseException:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return FakeOutOfMemoryError(msg)
    err_type = getattr(torch, "OutOfMemoryError", None)
    if err_type is None:
        return FakeOutOfMemoryError(msg)
    return err_type(msg)  # type: ignore[no-any-return]


def malloc_trim() -> None:
    """Return glibc's free heap memory to the OS, so RSS reflects live memory again.

    Tests that plant a host leak call it (after ``gc.collect()``) to start like a fresh process:
    memory freed by an earlier test would otherwise sit in glibc's free lists, and the leak would
    refill them without RSS moving. A no-op off Linux and on a libc without it (musl).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
