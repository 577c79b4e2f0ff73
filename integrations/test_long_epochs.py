"""Verdicts inside one long epoch, with real frameworks on CPU: the runs memwatch exists for have
one epoch of many steps (``max_steps`` with a streaming dataset, ``val_check_interval``, a custom
loop with no epoch at all). Each adapter's run plants a leak that must be found *inside* the
epoch, at a check every N steps; its clean twin must stay quiet.

The leak keeps one tensor per optimizer step in a list the training code owns; its holder is
named. The runs are planned for 10 million steps (``total_steps``), as a long pre-training run
is: at that length the leak can kill the run, so it is a warning (severity by consequence).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from memwatch import MemWatchWarning
from memwatch.testing import malloc_trim

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated:FutureWarning"),
]

STEPS = 600  # optimizer steps in the run: all in one epoch
EVERY = 150  # a check every EVERY steps: 4 checks
KEPT = 256 * 1024  # bytes the leak keeps per step (a float32[65536])
LONG_RUN = 10_000_000  # the run's planned length: long enough for the leak to matter
OPTIONS: dict[str, Any] = {"workers": False, "check_every_n_steps": EVERY, "check_every_s": None,
                           "total_steps": LONG_RUN}


def _leaks(findings: list[Any]) -> list[Any]:
    return [f for f in findings if f.kind == "leak" and f.metric.startswith("host.")]


def _found_inside_the_epoch(findings: list[Any], holder: str, caught: list[Any]) -> None:
    leaks = _leaks(findings)
    assert leaks, [f.to_dict() for f in findings]
    first = leaks[0]
    # Found at a check inside the one epoch (never an epoch end), by the third check at the
    # latest: the second check after the leak starts confirms it, the third is the margin.
    assert first.epoch == 0 and first.check is not None and first.check <= 2, first.to_dict()
    assert first.step is not None and first.step <= 3 * EVERY + 1
    assert first.severity == "warning" and holder in (first.culprit or ""), first.to_dict()
    texts = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]
    assert any("leak in host.rss" in t and holder in t for t in texts), texts


def _quiet(findings: list[Any], caught: list[Any]) -> None:
    assert not _leaks(findings), [f.to_dict() for f in findings]
    assert not [f for f in findings if f.severity != "info"], [f.to_dict() for f in findings]
    assert not [w for w in caught if issubclass(w.category, MemWatchWarning)]


@pytest.fixture
def caught() -> Iterator[list[Any]]:
    # Earlier tests in this process leave freed heap behind; a leak would first reuse it without
    # RSS moving. Hand it back to the kernel so that the run starts as a fresh process would.
    gc.collect()
    malloc_trim()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        yield got


class Stream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """A streaming dataset: no length, so no epoch ends before ``max_steps``."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        while True:
            yield {"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)}


class Corpus(torch.utils.data.Dataset[tuple[torch.Tensor]]):
    """A map-style dataset of ``n`` samples made on demand (a large tokenized corpus)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        return (torch.randn(8, generator=torch.Generator().manual_seed(i)),)


# ---------------------------------------------------------------------- transformers
@pytest.mark.parametrize("leaking", [True, False], ids=["leak", "clean"])
def test_transformers_max_steps_with_a_streaming_dataset(tmp_path: Path, caught: list[Any],
                                                          leaking: bool) -> None:
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from memwatch.integrations.transformers import MemWatchCallback

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.kept_activations: list[torch.Tensor] = []

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            if leaking and self.training:
                self.kept_activations.append(torch.ones(KEPT // 4))  # the planted leak
            return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}

    cb = MemWatchCallback(**OPTIONS)
    args = TrainingArguments(str(tmp_path), use_cpu=True, max_steps=STEPS, report_to=[],
                             per_device_train_batch_size=4, save_strategy="no",
                             disable_tqdm=True, logging_steps=10_000, dataloader_num_workers=0)
    trainer = Trainer(Tiny(), args, train_dataset=Stream(), callbacks=[cb])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    assert cb.memwatch.step_count == STEPS
    if leaking:
        _found_inside_the_epoch(cb.findings, "kept_activations", caught)
    else:
        _quiet(cb.findings, caught)


# ---------------------------------------------------------------------- Lightning
@pytest.mark.parametrize("leaking", [True, False], ids=["leak", "clean"])
def test_lightning_max_steps_with_val_check_interval(tmp_path: Path, caught: list[Any],
                                                     leaking: bool) -> None:
    import lightning.pytorch as L

    from memwatch.integrations.lightning import MemWatchCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.kept_features: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if leaking:
                self.kept_features.append(torch.ones(KEPT // 4))  # the planted leak
            return self.layer(batch[0]).pow(2).mean()  # type: ignore[no-any-return]

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.layer(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = MemWatchCallback(**OPTIONS)
    trainer = L.Trainer(max_steps=STEPS, val_check_interval=EVERY, limit_val_batches=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path),
                        callbacks=[cb], num_sanity_val_steps=0)
    # One epoch as long as the planned run (a map-style corpus read once): max_steps stops it.
    loader = torch.utils.data.DataLoader(Corpus(4 * LONG_RUN), batch_size=4)
    trainer.fit(Tiny(), loader, torch.utils.data.DataLoader(Corpus(8), batch_size=4))
    assert cb.memwatch.step_count == STEPS
    assert cb.eval_memwatch["val"].checks == STEPS // EVERY  # validation judged at each run
    if leaking:
        _found_inside_the_epoch(cb.findings, "kept_features", caught)
    else:
        _quiet(cb.findings, caught)


# ---------------------------------------------------------------------- Accelerate
@pytest.mark.parametrize("leaking", [True, False], ids=["leak", "clean"])
def test_accelerate_loop_without_epochs(tmp_path: Path, caught: list[Any], leaking: bool) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from memwatch.integrations.accelerate import attach

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(cpu=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    kept_grads: list[torch.Tensor] = []
    with attach(acc, opt, out_dir=str(tmp_path), **OPTIONS) as hook:
        for step, batch in enumerate(loader):  # a stream: the loop decides when it ends
            acc.backward((model(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean())
            opt.step()
            opt.zero_grad()
            if leaking:
                kept_grads.append(torch.ones(KEPT // 4))  # the planted leak
            if step + 1 == STEPS:
                break
    assert hook.memwatch.step_count == STEPS
    if leaking:
        _found_inside_the_epoch(hook.findings, "kept_grads", caught)
    else:
        _quiet(hook.findings, caught)
