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
            "unit", "n_steps", "floor", "peak", "rise", "shape", "threshold")}

    steady, held = W._steady, W._held_in_census

    def traced_steady(hist: Any, counts: Any) -> Any:
        out = steady(hist, counts)
        seen.append({"units": [_unit(e) for e in hist], "steady": [e.unit for e in out]})
        return out

    def traced_held(grown: Any, cur: Any, rss: Any, workers: int, cfg: Any) -> bool:
        r = held(grown, cur, rss, workers, cfg)
        seen.append({"census": dataclasses.asdict(grown) if grown else None, "cur": _unit(cur),
                     "rss": _unit(rss), "held_in_census": r})
        return r

    private, slowing = W._private_growth, W._slowing

    def traced_private(hist: Any, rss_hist: Any) -> bool:
        r = private(hist, rss_hist)
        seen.append({"rss_units": [_unit(e) for e in rss_hist], "private_growth": r})
        return r

    def traced_slowing(hist: Any, share: float) -> bool:
        r = slowing(hist, share)
        seen.append({"slowing": r})
        return r

    W._steady, W._held_in_census = traced_steady, traced_held
    W._private_growth, W._slowing = traced_private, traced_slowing
    return seen


if __name__ == "__main__":
    trace = _trace()
    out = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, default=str)
    with open(sys.argv[2] + ".trace", "w") as f:
        json.dump(trace, f, default=str)
