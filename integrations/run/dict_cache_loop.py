"""A plain loop of unknown length that leaks (the new user's loop of issue 42): a dict cache keyed
by step keeps ~100 KiB a step, 1,200 steps, no epochs, nothing of memwatch in it. ``--clean``
keeps nothing."""

from __future__ import annotations

import sys
import time

import torch

cache: dict[int, bytearray] = {}


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1200):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if "--clean" not in sys.argv:
            cache[step] = bytearray(100 * 1024)
        time.sleep(0.002)
    print("trained 1200 steps")


if __name__ == "__main__":
    main()
