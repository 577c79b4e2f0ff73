"""DataLoader worker loops for test_worker_count.py, each in its own interpreter.

Modes: ``rebuilt`` (a persistent-worker eval loader built at every evaluation and kept by a
``prepare``-like list: transformers#28469), ``reused`` (built once), ``cow`` (a Dataset of
Python strings read by 2 workers: copy-on-write within the first epoch, pytorch#13246),
``cow_numpy`` (the same data in one numpy array).

Usage: python worker_loops.py MODE OUT_JSON
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import memwatch

EPOCHS, STEPS, EVAL_EVERY = 4, 60, 20


class Prepared:
    """What matters here of a trainer's accelerator: ``prepare`` keeps every loader."""

    def __init__(self) -> None:
        self.loaders: list[DataLoader[Any]] = []

    def prepare(self, dl: DataLoader[Any]) -> DataLoader[Any]:
        self.loaders.append(dl)
        return dl


class Strings(Dataset[torch.Tensor]):
    def __init__(self, n: int, as_numpy: bool) -> None:
        rows = [f"{i:08d}" + "x" * 400 for i in range(n)]
        self.rows: Any = np.array(rows, dtype="S408") if as_numpy else rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        r = self.rows[i]
        return torch.tensor(len(r) + (r[0] if isinstance(r, bytes) else ord(r[0])))


acc = Prepared()


def run(mode: str) -> list[list[dict[str, Any]]]:
    torch.manual_seed(0)
    results = []
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    eval_set = TensorDataset(torch.randn(64, 8))
    cached: DataLoader[Any] | None = None
    train: Any = None
    if mode.startswith("cow"):
        # one pass a epoch: every row read in epoch 0, so the copying saturates there
        ds = Strings(30_000, as_numpy=mode == "cow_numpy")
        train = DataLoader(ds, batch_size=128, num_workers=2, shuffle=True,
                           persistent_workers=True)
    with memwatch.watch(device="cpu", workers=True, interval_s=0.05,
                        out_dir=tempfile.mkdtemp()) as mw:
        for _e in range(EPOCHS):
            it = iter(train) if train is not None else None
            for i in range(STEPS):
                loss = model(torch.randn(16, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if it is not None:
                    for _ in range(4):
                        next(it, None)
                if mode in ("rebuilt", "reused") and i % EVAL_EVERY == EVAL_EVERY - 1:
                    if mode == "rebuilt" or cached is None:
                        cached = acc.prepare(DataLoader(eval_set, batch_size=16, num_workers=1,
                                                        persistent_workers=True))
                    with torch.no_grad():
                        for (x,) in cached:
                            model(x)
                mw.step()
            results.append([f.to_dict() for f in mw.end_epoch()])
    return results


if __name__ == "__main__":
    out = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, default=str)
