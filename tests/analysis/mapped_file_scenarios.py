"""A real loop that reads a dataset through ``np.memmap``, with or without a leak beside it; run
by test_mapped_file.py, one interpreter per mode (RSS is per process).

Usage: python mapped_file_scenarios.py MODE DATA_DIR OUT_JSON [sampled]

Every mode reads a 96 MiB file through one ``np.memmap``, a quarter of it per epoch, so RSS grows
by file-backed pages while anonymous memory stays flat. Beside that:

* ``clean``: nothing;
* ``tensors``: a CPU tensor of 64 KiB appended to a global list every step (a leak the census
  sees);
* ``numpy``: a numpy array of 64 KiB appended every step, with ``tracemalloc=True`` (numpy's
  buffers are traced allocations; the census counts arrays as objects only);
* ``batches``: every batch of a 2-worker DataLoader kept and read (its storage is shared memory
  the workers filled: ``host.rss_shmem``, which a mapped file must never explain).

An epoch here takes a fraction of a second, less than the background reader's interval (1 s), so
RSS by kind is a few reads per epoch. With ``sampled``, steps take 5 ms and the reader runs every
50 ms: epochs are sampled as a real run's (minutes long) are.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

import memwatch

MIB = 1 << 20
EPOCHS, STEPS = 4, 200
DATA_BYTES = 96 * MIB
kept: list[object] = []


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """64 KiB float tensors, made in the worker: they reach the main process in shared memory."""

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16 * 1024,), float(i))


def on_tmpfs(path: str) -> bool:
    """The file lives in memory (its mapped pages are shared memory, not page cache)."""
    best, fstype = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
    return fstype in ("tmpfs", "ramfs")


def main() -> None:
    mode, data_dir, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    sampled = sys.argv[4:] == ["sampled"]
    path = os.path.join(data_dir, "train.bin")
    np.random.default_rng(0).integers(0, 255, DATA_BYTES, dtype=np.uint8).tofile(path)
    if on_tmpfs(os.path.realpath(path)):
        with open(out_path, "w") as f:
            json.dump({"tmpfs": True}, f)
        return
    data = np.memmap(path, dtype=np.uint8, mode="r")
    chunk = DATA_BYTES // (EPOCHS * STEPS)
    batches = None
    if mode == "batches":
        loader = torch.utils.data.DataLoader(Rows(), batch_size=1, num_workers=2,
                                             persistent_workers=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    epochs, latest = [], []
    with memwatch.watch(device="cpu", workers=False, signals=False,
                        tracemalloc=mode == "numpy", out_dir=tempfile.mkdtemp(),
                        interval_s=0.05 if sampled else 1.0) as mw:
        s = 0
        for _epoch in range(EPOCHS):
            if mode == "batches":
                batches = iter(loader)
            for i in range(STEPS):
                # a batch of the mapped dataset, as a data loader of token ids would take it
                x = torch.from_numpy(np.array(data[s * chunk:(s + 1) * chunk], dtype=np.float32))
                float(x.mean())
                if mode == "tensors":
                    kept.append(torch.full((16 * 1024,), float(i)))
                elif mode == "numpy":
                    kept.append(np.full(16 * 1024, i, dtype=np.float32))
                elif mode == "batches":
                    b = next(batches)  # type: ignore[call-overload]
                    float(b.sum())  # read: its pages become resident here
                    kept.append(b)
                s += 1
                if sampled:
                    time.sleep(0.005)  # the step's compute
                mw.step()
            epochs.append([f.to_dict() for f in mw.end_epoch()])
            latest.append(mw.latest())
    with open(out_path, "w") as f:
        json.dump({"epochs": epochs, "latest": latest}, f)


if __name__ == "__main__":  # never at import: pytest's collection imports this file
    main()
