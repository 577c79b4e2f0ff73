"""memwatch in a W&B run, offline: charts, findings table, leak chart, summary, artifacts.

A plain PyTorch loop with a planted leak (every step keeps a 256 KiB tensor in a list) logs to an
offline W&B run through ``memwatch.sinks.wandb.WandbSink``; then the example reads the run back
from its directory and prints what a person would see in the W&B UI after ``wandb sync``.

    WANDB_MODE=offline python examples/wandb_offline.py

``MEMWATCH_EXAMPLE_QUICK=1`` runs shorter epochs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")  # never goes online by accident
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402
import wandb  # noqa: E402

import memwatch  # noqa: E402
from memwatch.sinks import JsonlSink  # noqa: E402
from memwatch.sinks.wandb import WandbSink  # noqa: E402
from memwatch.testing.wandb_offline import read_offline_run  # noqa: E402

QUICK = os.environ.get("MEMWATCH_EXAMPLE_QUICK") == "1"
STEPS = 60 if QUICK else 200
EPOCHS = 3 if QUICK else 4


def main() -> int:
    # Absolute: wandb writes through a service process that may have been started elsewhere
    # (WANDB_SERVICE inherited from a parent), where a relative dir means another folder.
    out = Path("memwatch-out").resolve()
    run = wandb.init(project="memwatch-example", dir=str(out), config={"steps": STEPS})
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []  # the bug: grows by one 256 KiB tensor per step
    sinks = [WandbSink(), JsonlSink(out / "events.jsonl")]
    with memwatch.watch(device="cpu", workers=False, out_dir=str(out), sinks=sinks,
                        log_every_n_steps=10) as mw:
        for epoch in range(EPOCHS):
            for _ in range(STEPS):
                x = torch.randn(64, 256)
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                kept.append(torch.randn(256, 256))  # 256 KiB a step, never released
                run.log({"loss": loss.item()})
                mw.step()
            found = mw.end_epoch()
            print(f"epoch {epoch}: {[f'{f.kind}:{f.metric}' for f in found] or 'no findings'}")
    run_dir = Path(run.dir).parent
    run.finish()

    data = read_offline_run(run_dir)
    steps = [s for s, _ in data.series("memwatch/host.rss_gib")]
    print(f"run directory: {run_dir}")
    print(f"memwatch/host.rss_gib logged at {len(steps)} steps: {steps[:3]} ... {steps[-1:]}")
    tables = data.tables("memwatch/findings_table")
    rows = tables[-1]["data"] if tables else []
    print(f"findings table: {len(rows)} row(s)")
    for r in rows[-3:]:
        print("   ", r[:5])
    charts = sorted({k for row in data.history for k in row if k.startswith("memwatch/leak/")})
    print(f"leak charts: {charts}")
    print(f"verdict: {data.summary.get('memwatch/verdict')}")
    ours = [(a["name"], a["type"]) for a in data.artifacts
            if a["type"] in ("memwatch-oom", "memory-snapshot")]
    print(f"artifacts: {ours}")  # the end-of-run report and snapshot (the run had a warning)
    return 0


if __name__ == "__main__":
    sys.exit(main())
