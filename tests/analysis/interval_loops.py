"""One long epoch judged at checks inside it: a slow leak (16 KB a step, 8 MB between checks of
500 steps) and its clean twin. Runs in its own interpreter; writes every check's findings.

Usage: python interval_loops.py MODE OUT_JSON
"""

from __future__ import annotations

import json
import sys
import tempfile

mode = sys.argv[1] if __name__ == "__main__" else "none"
STEPS, EVERY = 3000, 500

kept: list = []


def main() -> list[dict]:
    import torch

    import memwatch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    found: list[dict] = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp(),
                        check_every_n_steps=EVERY, check_every_s=None, total_steps=STEPS,
                        steps_per_epoch=STEPS, warn=False) as mw:
        seen = 0
        for _ in range(STEPS):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "slow16k":
                kept.append(bytearray(16 * 1024))
            mw.step()
            if mw.checks > seen:
                seen = mw.checks
                found += [{"check": f.check, "step": f.step, **f.to_dict()}
                          for f in mw.findings if f.check == seen - 1]
    return found


if __name__ == "__main__":
    with open(sys.argv[2], "w") as f:
        json.dump(main(), f, default=str)
