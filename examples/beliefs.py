"""Verdicts that hold over the whole run: a leak that stops, a buffer that fills its bound.

A plain CPU training loop keeps a 200 KiB tensor a step in a ``collections.deque(maxlen=...)``
replay buffer for its first two epochs (bounded: it fills and stays), then one a step in a plain
list for three epochs (a debug dump switched on for a while: a leak that stops). memwatch says the
first is a leak, then withdraws it once its growth has stopped, in one console line; the second
is judged with its bound and never called a leak. ``mw.current_findings()`` is what the run
believes now; ``mw.findings`` and ``memwatch.analysis.beliefs.history()`` how it got there.

    python examples/beliefs.py
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile

import torch

import memwatch
from memwatch.analysis.beliefs import describe, history, state_of

QUICK = bool(os.environ.get("MEMWATCH_EXAMPLE_QUICK"))
STEPS, EPOCHS = (64, 9) if QUICK else (200, 9)

logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the console lines


class Agent:
    def __init__(self) -> None:
        self.net = torch.nn.Linear(64, 64)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01)
        self.debug_dump: list[torch.Tensor] = []  # the leak that stops
        self.replay: collections.deque[torch.Tensor] = collections.deque(maxlen=2 * STEPS)

    def step(self, epoch: int) -> None:
        x = torch.randn(32, 64)
        loss = self.net(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if epoch < 2:  # the replay buffer fills in the first two epochs, then stays full
            self.replay.append(torch.randn(51_200))
        elif epoch < 5:  # the debug dump, switched on for epochs 2-4 only
            self.debug_dump.append(torch.randn(51_200))


def main() -> None:
    agent = Agent()
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp(),
                        check_every_n_steps=None, check_every_s=None) as mw:
        for epoch in range(EPOCHS):
            for _ in range(STEPS):
                agent.step(epoch)
                mw.step()
            mw.end_epoch()
    print("what the run believes now (mw.current_findings()):")
    for f in mw.current_findings():
        line = f"  {state_of(f):<12} {f.kind} in {f.metric}"
        if f.belief is not None and len(changes := history(mw.findings, f.belief)) > 1:
            line += f"  [{describe(changes)}]"
        print(line)
    print(f"{len(mw.findings)} finding(s) in all (mw.findings: the history)")


if __name__ == "__main__":
    main()
