"""A tiny custom Accelerate loop run by ``accelerate launch`` in the multi-process suite.

Usage: ``accelerate launch --multi_gpu --num_processes 2 launch_script.py OUT_DIR`` (the
script's ``Accelerator(cpu=True)`` makes it MULTI_CPU on gloo). Each process
writes ``OUT_DIR/result-rank<N>.json``; a file-backed tracker records every ``accelerator.log``
call it receives in ``OUT_DIR/tracker-rank<N>.jsonl`` (trackers exist on the main process only).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from torch.utils.data import DataLoader, TensorDataset

from memwatch.integrations.accelerate import MemWatchWarning, attach

OUT = Path(sys.argv[1])


class FileTracker(GeneralTracker):
    """Writes each logged row, with the writing process's rank, to a JSON-lines file."""

    name = "file"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.rank = int(os.environ.get("RANK", "0"))

    @property
    def tracker(self) -> Any:
        return self

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        with open(OUT / f"tracker-rank{self.rank}.jsonl", "a") as f:
            f.write(json.dumps({"rank": self.rank, "step": step, "values": values}) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    # cpu=True: with WORLD_SIZE > 1 in the environment, Accelerate then runs MULTI_CPU on gloo.
    accelerator = Accelerator(cpu=True, log_with=[FileTracker()], project_dir=str(OUT))
    accelerator.init_trackers("launch")
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    model, opt, data = accelerator.prepare(model, opt, DataLoader(ds, batch_size=16))
    hook = attach(accelerator, opt, workers=False, log_every_n_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        for _ in range(2):
            for x, y in data:
                accelerator.backward(F.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
    mw = hook.memwatch
    result = {
        "rank": accelerator.process_index, "world_size": accelerator.num_processes,
        "is_main": accelerator.is_main_process, "steps": mw.step_count, "epochs": mw.epoch,
        "out_dir": mw.out_dir, "trackers": len(accelerator.trackers),
        "rss": mw.latest().get("host.rss"), "backend": accelerator.state.backend,
        # a clean run: memwatch must not have warned about anything
        "memwatch_warnings": [str(w.message) for w in caught
                              if issubclass(w.category, MemWatchWarning)],
    }
    hook.detach()
    accelerator.end_training()
    (OUT / f"result-rank{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
