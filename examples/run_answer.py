"""Every run gets its answer: a loop of unknown length, judged by the time it ends.

A plain loop with no epochs and no length given (the common case of a step-based script): at
the default ``check_every_n_steps="auto"`` the checks are sized to the run (steps 100, 200,
400 ... while the work since the last check is worth it), and ``close()`` has a last word on
what came after the last check. The loop keeps ~100 KiB a step in a dict keyed by step, a
cache nobody evicts; by exit the verdict names it.

What the closed session leaves in ``--out`` (default ``memwatch-answer/``):

* ``report.html``: the run's report, verdicts first (``memwatch report OUT`` opens it);
* ``summary.json``: the same answer for a job scheduler, a CI step or a notebook, read here with
  :func:`memwatch.bundle.run_summary.read_summary` (``memwatch ls OUT`` lists the run).

    python examples/run_answer.py                  # 1,200 steps, a few seconds on a CPU
    python examples/run_answer.py --clean          # the same loop, keeping nothing: "ok"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import memwatch
from memwatch.bundle.run_summary import read_summary

# The planted leak: a per-step cache nobody evicts.
cache: dict[int, bytearray] = {}


def main(steps: int, out: Path, clean: bool) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # No epochs, no total_steps: memwatch cannot know how long this runs.
    with memwatch.watch(device="cpu", workers=False, out_dir=out, warn=False) as mw:
        for step in range(steps):
            for _ in range(4):
                loss = model(torch.randn(64, 256)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            if not clean:
                cache[step] = bytearray(100 * 1024)
            mw.step()
        print(f"checks while the loop ran: {mw.checks}")
    print(f"checks with the last word at close(): {mw.checks}")
    for f in mw.current_findings():
        print(f"current verdict: [{f.severity}] {f.kind} in {f.metric}, held by "
              f"{f.evidence.get('holder')}")
    doc = read_summary(out)
    print(f"summary.json: {doc['steps']} steps, {doc['checks']} checks, verdict: "
          f"{doc['verdict']}, exit: {doc['exit']['status']}")
    print(f"report: {mw.report_path}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--out", type=Path, default=Path("memwatch-answer"))
    ap.add_argument("--clean", action="store_true", help="keep nothing (no leak)")
    args = ap.parse_args()
    main(args.steps, args.out, args.clean)
