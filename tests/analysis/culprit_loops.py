"""Plain training loops with one planted leak each, for test_culprits.py: Python objects that
must be weighed (numpy arrays, strings, bytearrays without torch), an autograd chain kept by a
running sum, and views that keep their bases. Each runs in its own interpreter.

Usage: python culprit_loops.py MODE OUT_JSON
"""

from __future__ import annotations

import json
import random
import sys
import tempfile

mode = sys.argv[1] if __name__ == "__main__" else "none"
STEPS, EPOCHS = 200, 4

kept_arrays: list = []  # numpy_list: one 100 KiB array per step
step_log: dict = {}  # string_dict: one ~8 KB formatted record per step
debug_frames: list = []  # bytearray_no_torch: one 64 KiB buffer per step


def run() -> list[list[dict]]:
    import memwatch

    results = []
    if mode == "bytearray_no_torch":
        w = [random.random() for _ in range(64)]
        with memwatch.watch(workers=False, out_dir=tempfile.mkdtemp()) as mw:
            for _e in range(EPOCHS):
                for _s in range(STEPS):
                    x = [random.random() for _ in range(64)]
                    g = sum(a * b for a, b in zip(w, x, strict=True))
                    w = [a - 0.001 * g * b for a, b in zip(w, x, strict=True)]
                    debug_frames.append(bytearray(64 * 1024))
                    mw.step()
                results.append([f.to_dict() for f in mw.end_epoch()])
        assert "torch" not in sys.modules, "the loop must run without torch"
        return results

    import numpy as np
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    total = 0  # graph_sum: the running loss kept with its graph

    class ScoreMetric:  # views: per-batch score maps kept as small views of their bases
        def __init__(self) -> None:
            self.kept: list[torch.Tensor] = []

        def update(self, score_map: torch.Tensor) -> None:
            self.kept.append(score_map.view(-1)[:64])  # a view: the whole map stays alive

    metric = ScoreMetric()
    kept_grads: list[torch.Tensor] = []  # local_list: held by this running frame only
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp()) as mw:
        s = 0
        for _e in range(EPOCHS):
            for _i in range(STEPS):
                x, y = torch.randn(16, 32), torch.randn(16, 1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if mode == "graph_sum":
                    total += loss  # the classic: no .item()
                elif mode == "numpy_list":
                    kept_arrays.append(np.random.rand(12800))  # 100 KiB
                elif mode == "string_dict":
                    step_log[f"step {s}"] = f"loss={loss.item():.6f} " + "x" * 8000
                elif mode == "local_list":
                    kept_grads.append(torch.ones(16384))  # 64 KiB
                elif mode == "views":
                    with torch.no_grad():
                        metric.update(torch.randn(16, 8, 256))  # 128 KiB map, 256 B kept
                s += 1
                mw.step()
            results.append([f.to_dict() for f in mw.end_epoch()])
    return results


if __name__ == "__main__":
    out = run()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, default=str)
