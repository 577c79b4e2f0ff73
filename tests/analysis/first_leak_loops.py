"""A new user's first own leaks: plain containers that gain 1 MiB of values every step, held by
a module global, a local of a running function or an attribute; and bounded twins. Each runs in
its own interpreter (RSS is per process) and writes every epoch end's findings.

Usage: python first_leak_loops.py MODE OUT_JSON
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile

mode = sys.argv[1] if __name__ == "__main__" else "none"
STEPS, EPOCHS = 40, 3
MIB = 1 << 20

STORE: dict = {}  # dict_numpy: a global dict of arrays
GRAD_DEBUG: dict = {}  # dict_of_dicts: a global dict of per-step dicts
HISTORY: collections.deque = collections.deque()  # deque_tensor: a deque without maxlen
OUTPUTS: list = []  # list_str


class Probe:
    """A user object that keeps what it sees (dict_str_attr)."""

    def __init__(self) -> None:
        self.seen: dict = {}


def payload(kind: str, step: int):  # noqa: ANN201 - whatever the mode keeps
    import numpy as np

    if kind == "numpy":
        return np.full(MIB // 8, float(step))
    if kind == "bytes":
        # Written bytes: bytes(MIB) is calloc'd, and glibc hands out fresh mmap'd zero pages
        # without touching them, so RSS grows by a few pages per MiB, not the MiB kept.
        return bytes(range(256)) * (MIB // 256)
    if kind == "str":
        return f"{step:08d}" * (MIB // 8)
    import torch

    return torch.full((MIB // 4,), float(step))


def main() -> list[list[dict]]:
    import numpy as np
    import torch

    import memwatch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    local_store: dict = {}  # dict_bytes_local: held by this running frame only
    probe = Probe()
    results = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp()) as mw:
        step = 0
        for _e in range(EPOCHS):
            for _s in range(STEPS):
                x, y = torch.randn(16, 32), torch.randn(16, 1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if mode == "dict_numpy":
                    STORE[f"step{step}"] = payload("numpy", step)
                elif mode == "dict_numpy_bounded":
                    STORE[f"step{step}"] = payload("numpy", step)
                    STORE.pop(f"step{step - 8}", None)
                elif mode == "dict_bytes_local":
                    local_store[step] = payload("bytes", step)
                elif mode == "dict_str_attr":
                    probe.seen[f"batch {step}"] = payload("str", step)
                elif mode == "deque_tensor":
                    HISTORY.append(payload("tensor", step))
                elif mode == "list_str":
                    OUTPUTS.append(payload("str", step))
                elif mode == "dict_of_dicts":
                    GRAD_DEBUG[step] = {"grad": payload("tensor", step), "loss": loss.item()}
                elif mode == "dict_of_lists":
                    GRAD_DEBUG[step] = [float(step)] * (MIB // 8)
                mw.step()
                step += 1
            results.append([f.to_dict() for f in mw.end_epoch()])
    del np
    return results


if __name__ == "__main__":
    out = main()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, default=str)
