"""Acceptance (1): a planted leak in a real Lightning run is reported, with its holder named."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest
import torch
from lightning_helpers import Regressor, column, loader, make_trainer, read_metrics

from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning

# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


def test_planted_leak_reported_by_the_second_epoch_after_it_starts(tmp_path: Path) -> None:
    # Epoch 0 is clean (warm-up); the leak starts in epoch 1; the fit ends with epoch 2, the
    # second leaking epoch: the verdict must be there by then.
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    model = Regressor(leak_from_epoch=1)
    trainer = make_trainer(tmp_path, [cb], max_epochs=3, log_every_n_steps=8)
    with pytest.warns(MemWatchWarning) as caught:
        trainer.fit(model, loader(48), loader(4))
    assert len(model.history) == 96  # the bug really ran: 2 epochs x 48 steps of kept graphs

    leaks = [f for f in cb.findings if f.kind == "leak"]
    assert leaks, [f.to_dict() for f in cb.findings]
    assert all(f.severity in ("warning", "critical") for f in leaks)
    assert all(f.bytes_per_step is not None and f.bytes_per_step > 100 * 1024 for f in leaks)
    # The holder: the LightningModule attribute that keeps the graphs alive. The first verdict
    # may come before the census has two epoch ends to compare; by the end it must be named.
    named = [f for f in leaks if f.culprit and "history" in f.culprit]
    assert named, [f.to_dict() for f in leaks]

    texts = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]
    leak_texts = [t for t in texts if "leak in host" in t or "leak in device" in t]
    # Once per finding, not once per epoch: one warning, plus one more when the holder is found.
    assert 1 <= len(leak_texts) <= 2, texts
    assert "history" in leak_texts[-1]

    rows = read_metrics(trainer)
    assert max(column(rows, "memwatch/findings/leak")) >= 1
    assert any(k.startswith("memwatch/findings/leak.") and k.endswith("_mib_per_step")
               for k in rows[0])


@pytest.mark.fresh_process
def test_a_leak_that_is_no_threat_prints_one_line(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # The same planted leak, judged against the fit's real length (144 steps): no threat
    # (info), so no MemWatchWarning (pytest would turn it into an error), but one line.
    cb = MemWatchCallback(workers=False)
    model = Regressor(leak_from_epoch=1)
    trainer = make_trainer(tmp_path, [cb], max_epochs=3, log_every_n_steps=8)
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        trainer.fit(model, loader(48), loader(4))
    leaks = [f for f in cb.findings if f.kind == "leak"]
    assert leaks and {f.severity for f in leaks} == {"info"}, [f.to_dict() for f in leaks]
    lines = [r.getMessage() for r in caplog.records if "leak in" in r.getMessage()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "\n" not in line and line.startswith("memwatch: leak in ")
    assert "held by " in line and "history" in line and "/step" in line
    assert "not a threat to this run" in line and ". Fix: " in line
    # Lightning's progress bar shows none of memwatch's keys; its loggers get them all.
    assert not [k for k in trainer.progress_bar_metrics if k.startswith("memwatch")]
    assert "memwatch/host.rss_gib" in read_metrics(trainer)[0]


class KeepsPredictions(L.Callback):
    """A user's Callback that keeps every step's outputs "for the end-of-run plot" (1 MiB of
    float32 a step) in a list of its own: the leak is in the callback, not the model."""

    def __init__(self) -> None:
        self.outputs: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.outputs.append(torch.full((1 << 18,), float(batch_idx)))


class ValidationHoard(Regressor):
    """Validation keeps 16 MiB of examples at every epoch end and never lets go: training steps
    see floors that climb epoch after epoch while each epoch is flat inside."""

    def __init__(self) -> None:
        super().__init__()
        self.hard_examples: list[torch.Tensor] = []

    def on_validation_epoch_end(self) -> None:
        self.hard_examples.append(torch.ones(4 << 20))


def first_leak_check(cb: MemWatchCallback) -> list[Any]:
    return [f for f in cb.findings if f.kind == "leak" and f.stage == "train"]


@pytest.mark.fresh_process
def test_a_user_callbacks_list_is_named_at_the_second_check(tmp_path: Path) -> None:
    keeper = KeepsPredictions()
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [keeper, cb], max_epochs=3, log_every_n_steps=8)
    trainer.fit(Regressor(), loader(32), loader(4))
    leaks = first_leak_check(cb)
    assert leaks, [f.to_dict() for f in cb.findings]
    first = leaks[0]
    assert first.epoch == 1  # the second check: the end of epoch 1
    # Named where the user keeps it: the callback's list (through the variable that holds the
    # callback, or the trainer's callbacks), by what it gained since the last check.
    assert first.culprit is not None and ".outputs (list, " in first.culprit, first.culprit
    assert "+32 since the last check" in first.culprit
    assert any("outputs` grows every step" in s for s in first.suggestions), first.suggestions


def test_memory_kept_by_validation_hooks_is_a_leak_named_at_the_second_check(
        tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    model = ValidationHoard()
    trainer = make_trainer(tmp_path, [cb], max_epochs=4, log_every_n_steps=8)
    trainer.fit(model, loader(32), loader(4))
    assert len(model.hard_examples) >= 4  # (and once more in Lightning's sanity check)
    leaks = first_leak_check(cb)
    assert leaks, [f.to_dict() for f in cb.findings]
    first = leaks[0]
    # Validation of epoch 0 keeps the first block after epoch 0's training steps: epoch 1's
    # floor is the first to show it, epoch 2's the second.
    assert first.epoch <= 2, [f.to_dict() for f in leaks]
    assert first.culprit is not None and "hard_examples (list, " in first.culprit, first.culprit
    # One block an epoch, not one a step: the advice says so, over the epochs the census pair
    # spans (a check between them may have taken no census: only within the cost budget).
    a, b = first.evidence["census_epochs"]
    first_step = first.evidence["census_at_steps"][0]
    since = "since the last check" if b - a <= 1 else f"since step {first_step:,}"
    # Named by its owner's class where the census saw it through the model: the user's name.
    assert any(f"ValidationHoard.hard_examples` keeps growing (+{max(b - a, 1)} {since})" in s
               for s in first.suggestions), (first.suggestions, a, b)
