"""Real runs whose reports the report tests render (shared by tests/test_report_*.py).

Nothing here is mocked: bundles come from the real flight recorder on a FakeDevice OOM, the live
run drives a real DataLoader with worker processes, exports come from the real sinks.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import memwatch
from memwatch.testing import FakeDevice, malloc_trim

MIB = 1 << 20


class HistoryDevice(FakeDevice):
    """A FakeDevice that records allocation history in the shape of torch's snapshot
    (``device_traces`` events and per-block ``frames``), with the real Python stack of each
    ``malloc`` call: what ``torch.cuda.memory._record_memory_history()`` adds to a snapshot."""

    def __init__(self, total_bytes: int) -> None:
        super().__init__(total_bytes=total_bytes)
        self.events: list[dict[str, Any]] = []
        self.frames_of: dict[int, list[dict[str, Any]]] = {}  # handle -> frames
        self.addr_of: dict[int, int] = {}

    def _frames(self) -> list[dict[str, Any]]:
        stack = traceback.extract_stack()[:-2]
        return [{"filename": f.filename, "line": f.lineno, "name": f.name}
                for f in reversed(stack)]

    def malloc(self, nbytes: int) -> int:
        frames = self._frames()
        h = super().malloc(nbytes)
        seg, block = self._handles[h]
        addr = seg.address + block.offset
        self.addr_of[h] = addr
        self.frames_of[h] = frames
        self.events.append({"action": "alloc", "addr": addr, "size": block.size,
                            "frames": frames})
        return h

    def _raise_oom(self, size: int) -> None:
        # torch records the OOM in the trace before it calls the OOM observers (which capture).
        self.events.append({"action": "oom", "addr": 0, "size": size, "frames": self._frames()})
        super()._raise_oom(size)

    def free(self, handle: int) -> None:
        seg, block = self._handles[handle]
        size = block.size
        super().free(handle)
        addr = self.addr_of.pop(handle)
        self.frames_of.pop(handle, None)
        self.events.append({"action": "free_requested", "addr": addr, "size": size, "frames": []})
        self.events.append({"action": "free_completed", "addr": addr, "size": size,
                            "frames": []})

    def snapshot(self) -> dict[str, Any]:
        snap = super().snapshot()
        by_addr = {self.addr_of[h]: fr for h, fr in self.frames_of.items()}
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                if b["address"] in by_addr:
                    b["frames"] = by_addr[b["address"]]
        snap["device_traces"] = [list(self.events)]
        return snap


def cache_activations(dev: FakeDevice, cache: list[int]) -> None:
    """The planted leak: keeps 1 MiB per step (named so that the stack table shows it)."""
    cache.append(dev.malloc(MIB + 512 * 1024))


def train_step(dev: FakeDevice) -> None:
    tmp = [dev.malloc(2 * MIB) for _ in range(3)]  # activations, freed within the step
    for h in tmp:
        dev.free(h)


def oom_bundle(out_dir: Path, history: bool = True, epochs: int = 3, steps: int = 50,
               request: int = 120 * MIB) -> Path:
    """A bundle of a run that leaks on a (fake) GPU and dies of a CUDA OOM."""
    dev: FakeDevice = HistoryDevice(256 * MIB) if history else FakeDevice(total_bytes=256 * MIB)
    cache: list[int] = []
    with memwatch.watch(device=dev, workers=False, out_dir=out_dir, signals=False,
                        watchdog=False) as mw:
        for _ in range(epochs):
            for _ in range(steps):
                train_step(dev)
                cache_activations(dev, cache)
                mw.step()
            mw.end_epoch()
        path = None
        try:
            dev.malloc(request)
        except Exception as e:  # noqa: BLE001
            path = mw.handle_exception(e)
    assert path is not None, "the request did not fail"
    return path


class GrowingDataset:
    """Each worker keeps every item it produced: per-worker growth visible as USS and RSS."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.kept: list[bytes] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        self.kept.append(os.urandom(64 * 1024))
        return torch.zeros(4)


def live_run_with_workers(out_dir: Path, epochs: int = 3) -> Any:
    """A real CPU loop with two persistent DataLoader workers; returns the closed MemWatch."""
    import torch

    loader = torch.utils.data.DataLoader(GrowingDataset(96), batch_size=2, num_workers=2,
                                         persistent_workers=True)
    keep: list[Any] = []
    with memwatch.watch(device="cpu", out_dir=out_dir, signals=False, interval_s=0.05,
                        watchdog=False) as mw:
        for _ in range(epochs):
            for batch in loader:
                keep.append(torch.ones(16 * 1024))  # 64 KiB per step held by the loop
                _ = batch.sum()
                mw.step()
            mw.end_epoch()
    del loader
    return mw


#: The planted leak of :func:`leak_bundle`: a module global, so its holder reads
#: ``report_builders.KEPT``.
KEPT: list[Any] = []


def leak_bundle_fresh(out_dir: Path) -> Path:
    """:func:`leak_bundle` made in an interpreter of its own: in a long-lived test process the
    freed heap of earlier tests (and glibc's raised mmap threshold) absorbs the planted leak and
    RSS stays flat, so whether the bundle holds a leak verdict would depend on the tests before.
    For module-scoped fixtures, which cannot use the ``fresh_process`` marker."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; import report_builders as rb; "
            "print(rb.leak_bundle(Path(sys.argv[1])))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, str(out_dir)], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def leak_bundle(out_dir: Path, epochs: int = 3, steps: int = 40) -> Path:
    """A bundle (``mw.dump``) of a CPU run whose global list ``KEPT`` gains 512 KiB a step."""
    import gc

    import torch

    KEPT.clear()
    # Earlier tests' freed heap back to the kernel first: the leak would refill it, RSS flat.
    gc.collect()
    malloc_trim()
    with memwatch.watch(device="cpu", workers=False, out_dir=out_dir, signals=False,
                        watchdog=False) as mw:
        for _ in range(epochs):
            for _ in range(steps):
                KEPT.append(torch.ones(128 * 1024))  # 512 KiB, kept: the leak
                mw.step()
            mw.end_epoch()
        path = mw.dump("the report's first screen")
    KEPT.clear()
    assert path is not None
    return path

