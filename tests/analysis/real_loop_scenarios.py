"""Tiny real CPU training loops with one planted bug each, run by test_analysis_real.py.

Usage: python real_loop_scenarios.py MODE OUT_JSON   (MODE: cache, eval, exc, hook, clean)
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch

import memwatch

mode = "clean"  # set by main(); a module-level name so the loop can read it
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
val_outputs: list[torch.Tensor] = []
errors: list[BaseException] = []


class State:
    def __init__(self) -> None:
        self.cache: dict[int, torch.Tensor] = {}


state = State()


def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
    out = model(x)
    if mode == "exc":
        try:
            big = torch.randn(32, 256)  # noqa: F841 - kept alive by the stored traceback
            raise RuntimeError("bad batch")
        except RuntimeError as e:
            errors.append(e)
    loss = torch.nn.functional.mse_loss(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def main() -> None:
    global mode
    mode, out_path = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    results = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp()) as mw:
        s = 0
        for _epoch in range(3):
            for _i in range(250):
                train_step(torch.randn(32, 64), torch.randn(32, 1))
                if mode == "cache":
                    state.cache[s] = torch.randn(32, 256)
                elif mode == "eval":
                    val_outputs.append(model(torch.randn(32, 64)))  # no torch.no_grad()
                elif mode == "hook":
                    store: list[torch.Tensor] = []
                    model[0].register_forward_hook(lambda m, i, o, store=store: store.append(o))
                s += 1
                mw.step()
            results.append([f.to_dict() for f in mw.end_epoch()])
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":  # never at import: pytest's collection imports this file
    main()
