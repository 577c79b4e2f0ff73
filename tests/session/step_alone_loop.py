"""A real CPU loop of one long epoch that only ever calls ``mw.step()``, run in a fresh
interpreter by ``test_checks.py``: a process that has already run hundreds of tests keeps freed
heap that a leak refills for hundreds of steps without RSS moving (a leak nobody is short of
memory for yet), which is not what this loop is about.

    python step_alone_loop.py OUT_DIR leak|clean RESULT.json
"""

from __future__ import annotations

import json
import sys
import warnings

import torch

import memwatch
from memwatch import MemWatchWarning
from memwatch.sinks import MemorySink

kept_outputs: list[torch.Tensor] = []


def run(out_dir: str, leaking: bool) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memwatch.watch(device="cpu", workers=False, out_dir=out_dir, sinks=[sink],
                            check_every_n_steps=200, check_every_s=None,
                            total_steps=10_000_000) as mw:
            for _ in range(800):
                x = torch.randn(16, 32)
                out = model(x)
                loss = out.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if leaking:
                    kept_outputs.append(torch.ones(16384))  # the planted leak: 64 KiB a step
                mw.step()
    return {
        "findings": [f.to_dict() for f in mw.findings],
        "said": [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)],
        # the same objects reached the sink
        "in_sink": [any(f is g for g in sink.findings) for f in mw.findings],
    }


if __name__ == "__main__":
    result = run(sys.argv[1], sys.argv[2] == "leak")
    with open(sys.argv[3], "w") as fh:
        json.dump(result, fh, default=str)
