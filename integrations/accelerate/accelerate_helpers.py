"""Tiny models, data and a custom Accelerate loop for the memwatch end-to-end suites."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memwatch.testing import malloc_trim  # noqa: F401 - the tests import it from here
from memwatch.testing.wandb_offline import records

N_IN = 32


class Regressor(nn.Module):
    """An MLP regressor. With ``leaking`` set, ``forward`` plants a classic leak: it keeps every
    batch's hidden activations (with their autograd graph) in ``history``, as a debugging
    "remember the features" line left in a model does. (A loss kept after ``backward()`` would
    hold little: backward frees the graph's saved tensors.)"""

    def __init__(self, width: int = 2048) -> None:
        super().__init__()
        self.inp = nn.Linear(N_IN, width)
        self.out = nn.Linear(width, 1)
        self.leaking = False
        self.history: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.inp(x))
        if self.leaking:
            self.history.append(hidden)  # the planted bug
        return self.out(hidden)  # type: ignore[no-any-return]


def loader(n_batches: int, batch_size: int = 128, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    n = n_batches * batch_size
    ds = TensorDataset(torch.randn(n, N_IN, generator=g), torch.randn(n, 1, generator=g))
    return DataLoader(ds, batch_size=batch_size)


def setup(n_batches: int = 8, batch_size: int = 16, width: int = 64,
          **accelerator_kw: Any) -> tuple[Accelerator, Regressor, Any, Any]:
    accelerator_kw.setdefault("cpu", True)
    accelerator = Accelerator(**accelerator_kw)
    model = Regressor(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, data = accelerator.prepare(model, opt, loader(n_batches, batch_size))
    return accelerator, model, opt, data


def train(accelerator: Accelerator, model: Any, opt: Any, data: Any, epochs: int,
          leak_from_epoch: int | None = None,
          after_step: Callable[[int], None] | None = None) -> int:
    """A plain custom loop (``accelerator.accumulate`` as the docs show it); returns the number
    of real optimizer steps (counted the way Accelerate's examples count them)."""
    completed = 0
    for epoch in range(epochs):
        model.train()
        for x, y in data:
            with accelerator.accumulate(model):
                model.leaking = leak_from_epoch is not None and epoch >= leak_from_epoch
                loss = F.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                completed += 1
                if after_step is not None:
                    after_step(completed)
    return completed


def session_story(mw: Any) -> str:
    """What a session saw, for a failed assertion to print: its epochs (steps, seconds, RSS at
    the first and last step and the lowest reading, from each epoch's summary), its checks,
    every finding (check, rule, kind, severity, metric), the censuses taken, and what the
    analyzer judged of RSS and the C allocator's figures at each unit (shape, the held-growth
    verdict up to it, floors, thresholds, closing readings). A verdict that did not come is
    then told from the run's own figures, not guessed."""
    lines = [f"steps {mw.step_count}, checks {mw.checks}, epochs {len(mw.epochs)}"]
    for e in mw.epochs:
        rss = "-"
        if "host.rss" in e.keys:
            i = e.col("host.rss")
            rss = "/".join(f"{v / 2**20:.1f}" for v in (e.first[i], e.floor[i], e.last[i]))
        lines.append(f"  epoch {e.epoch}: steps {e.start_step}-{e.end_step}, "
                     f"{e.t_end - e.t_start:.1f} s, RSS MiB first/lowest/last {rss}")
    for f in mw.findings:
        lines.append(f"  check {f.check} step {f.step}: {f.rule} {f.kind} {f.severity} "
                     f"{f.metric}: {f.message[:160]}")
    analyzer = mw.analyzer
    history = getattr(analyzer, "history", None) or {}
    if analyzer is not None:
        lines.append(f"  censuses {getattr(analyzer, 'censuses', '?')}")
    for metric in ("host.rss", "host.malloc_in_use", "host.malloc_free"):
        hist = history.get(metric, [])
        for k, h in enumerate(hist):
            mib = {name: "-" if v is None else f"{v / 2**20:.1f}" for name, v in (
                ("floor", h.floor), ("lo_end", h.lo_end), ("peak", h.peak), ("rise", h.rise),
                ("growth", h.growth), ("thr", h.threshold), ("closing", h.closing))}
            held = analyzer.config.held(hist[:k + 1])
            lines.append(
                f"  {metric} {h.unit}: {h.shape}, held {held}, points {h.n_points}, MiB "
                + " ".join(f"{n} {v}" for n, v in mib.items())
                + f", slope {h.slope / 2**20:.3f} (high {h.trend.slope_high / 2**20:.3f}) MiB/step")
    return "\n".join(lines)


def reset_accelerate() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()



# ---------------------------------------------------------------------- W&B transaction log
def wandb_history(path: Path) -> list[dict[str, Any]]:
    """Every history row (``run.log``) of a ``.wandb`` file: key -> decoded value, plus
    ``_step``."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows: list[dict[str, Any]] = []
    for data in records(path):  # memwatch's own reader of the log (CRC-checked)
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        if rec.history.HasField("step"):
            row.setdefault("_step", rec.history.step.num)
        rows.append(row)
    return rows
