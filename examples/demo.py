"""``make demo``: a plain PyTorch loop with a planted leak, and what memwatch says about it.

The loop is ``examples/plain_loop.py`` run with ``--leak``: every step keeps a logging loss with
its autograd graph in a module-level list. memwatch should report a ``leak`` on ``host.rss`` that
names ``loss_history`` and the ``grad_fn`` of what it holds, with a forecast and suggestions.

    python examples/demo.py                  # 4 epochs of 40 steps, under a minute
    python examples/demo.py --epochs 2 --steps 5
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import plain_loop  # noqa: E402  (the example next to this file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="memwatch demo: a planted leak in a plain loop")
    quick = bool(os.environ.get("MEMWATCH_EXAMPLE_QUICK"))  # the test suite's short run
    ap.add_argument("--epochs", type=int, default=2 if quick else 4)
    ap.add_argument("--steps", type=int, default=5 if quick else 40)
    ap.add_argument("--out-dir", default="memwatch-out")
    args = ap.parse_args(argv)
    print("memwatch demo: a tiny MLP on CPU with 2 DataLoader workers; every step keeps a "
          "logging loss WITH its graph (the planted leak).\n")
    findings = plain_loop.train(args.epochs, args.steps, leak=True, out_dir=args.out_dir)
    print()
    # The latest verdict per metric (a leak is re-reported at each epoch end while it lasts).
    leaks = {f.metric: f for f in findings if f.kind == "leak"}
    if leaks:
        print("memwatch's leak verdicts:")
        for f in sorted(leaks.values(), key=lambda f: -(f.bytes_per_step or 0)):
            print(f"  {f.metric}: {(f.bytes_per_step or 0) / 1024:.0f} KiB per step"
                  + (f"; culprit: {f.culprit}" if f.culprit else ""))
    elif findings:
        print(f"memwatch reported {len(findings)} finding(s), none of them a leak.")
    else:
        # Expected only where the analyzer is missing or the run was too short to judge.
        print("memwatch reported no findings (run longer, e.g. --epochs 4 --steps 40).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
