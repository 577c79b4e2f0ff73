"""DataLoader worker loops for test_worker_census.py, each in its own interpreter: 2 persistent
workers read a Dataset for 3 epochs; ``cache`` keeps every sample it makes in a per-worker dict
keyed by a random draw (never hit: +2 KiB per sample in each worker), ``bounded`` keeps them in
an LRU of 64 entries (quiet), ``module`` in a list global of the Dataset's module.

Usage: python worker_census_loops.py MODE OUT_JSON
"""

from __future__ import annotations

import collections
import json
import random
import sys
import tempfile
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import memwatch

EPOCHS, BATCH, N = 3, 32, 32 * 120
SEEN: list[torch.Tensor] = []  # module: what every worker keeps, at module level


class Augmenting(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.cache: dict[tuple[int, int], torch.Tensor] = {}
        self.recent: collections.OrderedDict[int, torch.Tensor] = collections.OrderedDict()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(512)  # 2 KiB
        if self.mode == "cache":
            self.cache[(i, random.getrandbits(31))] = x  # the bug: never hit, never evicted
        elif self.mode == "module":
            SEEN.append(x)
        else:  # bounded: the same kind of cache, with eviction
            self.recent[i] = x
            while len(self.recent) > 64:
                self.recent.popitem(last=False)
        return x[:16], torch.tensor(i % 4)


def run(mode: str) -> list[list[dict[str, Any]]]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Augmenting(mode), batch_size=BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True)
    results = []
    with memwatch.watch(device="cpu", workers=True, interval_s=0.05,
                        out_dir=tempfile.mkdtemp()) as mw:
        for _ in range(EPOCHS):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                mw.step()
            results.append([f.to_dict() for f in mw.end_epoch()])
    return results


def _trace() -> list[dict[str, Any]]:
    """What the workers rule saw at each check (its steady units, the workers' censuses and
    what it made of them), kept beside the findings: a run that is late tells why."""
    import dataclasses

    from memwatch.analysis.rules import workers as W

    seen: list[dict[str, Any]] = []

    def _unit(e: Any) -> dict[str, Any] | None:
        return None if e is None else {k: getattr(e, k) for k in (
            "unit", "n_steps", "floor", "peak", "lo_end", "rise", "shape", "threshold")}

    def trace(name: str, describe: Any) -> None:
        """Replace ``W.<name>`` by a call that records ``describe(args, result)``."""
        fn = getattr(W, name)

        def traced(*args: Any) -> Any:
            r = fn(*args)
            seen.append(describe(args, r))
            return r

        setattr(W, name, traced)

    trace("_steady", lambda a, r: {"units": [_unit(e) for e in a[0]],
                                   "steady": [e.unit for e in r]})
    trace("_held_in_census", lambda a, r: {
        "census": dataclasses.asdict(a[0]) if a[0] else None,
        "units": [_unit(e) for e in a[1]], "rss": _unit(a[2]), "prev_rss": _unit(a[3]),
        "held_in_census": r})
    trace("_private_growth", lambda a, r: {"rss_units": [_unit(e) for e in a[1]],
                                           "private_growth": r})
    trace("_slowing", lambda a, r: {"slowing": r})
    return seen


if __name__ == "__main__":
    trace = _trace()
    out = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, default=str)
    with open(sys.argv[2] + ".trace", "w") as f:
        json.dump(trace, f, default=str)
