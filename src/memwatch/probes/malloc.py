"""What the C allocator holds: glibc's ``mallinfo2()``, read once a background pass.

RSS says how much memory the process has; it cannot say whether that memory is *in use* or
free memory the allocator keeps (glibc arenas keep freed chunks for reuse and return them to the
kernel only from the top of the heap, or on ``malloc_trim``). ``mallinfo2`` tells them apart:

* ``host.malloc_in_use``: bytes in chunks handed out and not freed (``uordblks``, in arenas) plus
  bytes in chunks glibc mapped on their own (``hblkhd``: allocations of 128 KiB or more). Every
  ``malloc`` of Python objects, numpy arrays, CPU tensors and C extensions is in it.
* ``host.malloc_free``: free bytes the arenas keep (``fordblks``): memory RSS counts that nothing
  uses.

RSS rising with in-use bytes flat is allocator retention; in-use bytes rising with no Python
object explaining them is memory held by native code. ``mallinfo2`` exists from glibc 2.33 on;
elsewhere (musl, macOS, an older glibc) the metrics are absent and memwatch says it cannot tell
the two apart. It walks the arenas' free lists under their locks: a few microseconds to a few
milliseconds on fragmented heaps (``benchmarks/bench_malloc_info.py``), so it is never read per
step: the session reads it again at the step after each background pass, where the loop's
temporaries are freed (``Sampling._at_step``).

Example::

    >>> from memwatch.probes.malloc import MallocInfo
    >>> info = MallocInfo.open()
    >>> info is None or info.read()["host.malloc_in_use"] > 0
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["KEYS", "MallocInfo"]

KEYS = ("host.malloc_in_use", "host.malloc_free")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


class MallocInfo:
    """The C allocator's in-use and free bytes (glibc ``mallinfo2``)."""

    def __init__(self, fn: object) -> None:
        self._fn = fn

    @classmethod
    def open(cls) -> MallocInfo | None:
        """The reader, or None where glibc's ``mallinfo2`` is not available."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = libc.mallinfo2
        except (OSError, AttributeError):
            return None
        fn.restype = _Mallinfo2
        fn.argtypes = []
        return cls(fn)

    def read(self) -> dict[str, float]:
        m = self._fn()  # type: ignore[operator]
        return {"host.malloc_in_use": float(m.uordblks + m.hblkhd),
                "host.malloc_free": float(m.fordblks)}
