"""Lightning ``strategy="ddp"`` on 2 CPU processes with a MemWatchCallback: a script, not a test.

Usage: ``python ddp_script.py OUT_DIR`` (run by ``test_lightning_ddp_subprocess.py``).

``strategy="ddp"`` uses Lightning's subprocess-script launcher: this process becomes rank 0 and,
inside ``trainer.fit``, starts the other local ranks by re-running this same command line
(``[sys.executable, <this file>, OUT_DIR]``) with ``LOCAL_RANK=1``, ``NODE_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` in their environment. That is why it cannot run inside pytest
(the child would re-run pytest's command line). Lightning sets no ``TORCHELASTIC_RUN_ID``, so
memwatch's rank 0 makes up the job id and broadcasts it at start.

Global rank 1 keeps 256 KiB per step (a leak on one rank only). Each rank writes
``OUT_DIR/rank<N>.json`` at teardown: its findings, rank 0's per-rank summaries, the agreed job
identity, its process ids, the launcher and the memwatch warnings it emitted.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import CSVLogger
from lightning_helpers import RankOneLeaks, loader, make_trainer

from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning


class RecordingCallback(MemWatchCallback):
    """Writes what its rank saw at teardown, before the session is closed."""

    def __init__(self, out: Path, caught: list[warnings.WarningMessage], **kw: Any) -> None:
        super().__init__(**kw)
        self.out = out
        self.caught = caught

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        mw = self.memwatch
        # A bundle on demand on every rank: it lands in that rank's out_dir, with the job id in
        # its manifest (``memwatch ls`` groups a job's bundles by it).
        bundle = None if mw is None else mw.dump("end of the ddp test run")
        launcher = getattr(trainer.strategy, "launcher", None)
        rec = {
            "rank": trainer.global_rank, "local_rank": trainer.local_rank,
            "world_size": trainer.world_size, "pid": os.getpid(), "ppid": os.getppid(),
            "argv": sys.argv, "env_local_rank": os.environ.get("LOCAL_RANK"),
            "launcher": type(launcher).__name__,
            "findings": [f.to_dict() for f in self.findings],
            "rank_summaries": [] if mw is None else mw.rank_summaries,
            "job": None if mw is None else mw.job,
            "steps": None if mw is None else mw.step_count,
            "out_dir": None if mw is None else mw.out_dir,
            "bundle": None if bundle is None else str(bundle),
            "memwatch_warnings": [str(w.message) for w in self.caught
                                  if issubclass(w.category, MemWatchWarning)],
        }
        super().teardown(trainer, pl_module, stage)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(rec))


def main() -> None:
    out = Path(sys.argv[1])
    # Tiny model on a 2-core machine: one intra-op thread per rank (Lightning's launcher would
    # pick cpu_count // 2 anyway when OMP_NUM_THREADS is unset).
    torch.set_num_threads(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Planned as a long run (10 million steps): there, rank 1's 256 KiB per step can kill it,
        # so it is warned about (in the 128 steps this run really has, it would be information).
        cb = RecordingCallback(out, caught, workers=False, total_steps=10_000_000)
        # 64 batches of 16 over 2 ranks: 32 steps per rank per epoch. The leak starts in epoch 0,
        # a verdict is due by the end of epoch 2; epoch 3 is the margin.
        trainer = make_trainer(out, [cb], strategy="ddp", accelerator="cpu", devices=2,
                               max_epochs=4, limit_val_batches=0, num_sanity_val_steps=0,
                               logger=CSVLogger(str(out / "csv"), name="", version=0),
                               log_every_n_steps=8)
        trainer.fit(RankOneLeaks(width=32), loader(64, 16))
    # Lightning does not wait for the ranks it started: rank 0 does, so that this command's exit
    # status covers every rank (the children have no processes of their own: an empty list).
    codes = [p.wait(timeout=120) for p in getattr(trainer.strategy.launcher, "procs", [])]
    if any(codes):
        sys.exit(f"rank(s) started by Lightning failed with exit status {codes}")


if __name__ == "__main__":
    main()
