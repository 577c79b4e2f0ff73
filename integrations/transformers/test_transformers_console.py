"""Quiet consoles: the rows the ``Trainer`` prints carry at most one memwatch key
(``console="one"``, the default) or none, while ``log_history`` and every ``report_to`` logger
keep every key. Real runs; what was printed is captured from stdout."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hf_helpers import LeakyTrainer, Tokens, make_args, tiny_bert

from memwatch.core.errors import ConfigError
from memwatch.integrations.transformers import MemWatchCallback

STEPS = 10  # optimizer steps per epoch (batch 8); 2 epochs, a row every 5 steps


def printed_rows(out: str) -> list[dict[str, str]]:
    """The rows PrinterCallback / ProgressCallback printed (Python dict literals)."""
    return [ast.literal_eval(line.strip()) for line in out.replace("\r", "\n").splitlines()
            if line.strip().startswith("{'")]


def memwatch_keys(row: dict[str, object]) -> list[str]:
    return [k for k in row if k.startswith("memwatch/")]


@pytest.mark.parametrize(("console", "tqdm", "shown"),
                         [("one", False, 1), ("none", True, 0), ("all", False, None)])
def test_printed_rows_and_log_history(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      console: str, tqdm: bool, shown: int | None) -> None:
    cb = MemWatchCallback(workers=False, console=console)
    args = make_args(tmp_path, num_train_epochs=2, logging_steps=5, disable_tqdm=not tqdm)
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(8 * STEPS), callbacks=[cb])
    trainer.train()
    out = capsys.readouterr()
    rows = printed_rows(out.out + out.err)
    loss = [r for r in rows if "loss" in r]
    assert len(loss) == 4, rows  # every loss row printed (progress bar or printer alike)
    history = [r for r in trainer.state.log_history if "loss" in r]
    full = memwatch_keys(history[0])
    assert len(full) >= 5 and all(memwatch_keys(r) == full for r in history)  # all kept
    for row in loss:
        if shown is None:
            assert memwatch_keys(row) == full
        else:
            assert memwatch_keys(row) == ["memwatch/host.rss_gib"][:shown], row
    # memwatch's own rows (the findings of each epoch end) are for the loggers: printed only
    # with console="all".
    own = [r for r in rows if "memwatch/findings/count" in r]
    assert len(own) == (2 if console == "all" else 0)
    if shown is not None:  # (with every key: ~620 characters, 13 memwatch keys on Linux)
        lines = (out.out + out.err).replace("\r", "\n").splitlines()
        widths = [len(line.strip()) for line in lines if line.strip().startswith("{'loss'")]
        assert len(widths) == 4 and max(widths) < 200, widths


def test_console_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="console='some'"):
        MemWatchCallback(console="some")


@pytest.mark.slow  # a real offline W&B run
def test_wandb_still_gets_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    from memwatch.testing.wandb_offline import read_offline_run

    for var, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(tmp_path)),
                       ("WANDB_CONSOLE", "off"), ("WANDB_PROJECT", "memwatch-test")):
        monkeypatch.setenv(var, value)
    cb = MemWatchCallback(workers=False)
    args = make_args(tmp_path, report_to=["wandb"], num_train_epochs=1, logging_steps=5,
                     run_name="memwatch-console")
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(8 * STEPS), callbacks=[cb])
    trainer.train()
    run = wandb.run
    assert run is not None
    run_dir = Path(run.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)
    printed = [r for r in printed_rows(capsys.readouterr().out) if "loss" in r]
    assert printed and all(memwatch_keys(r) == ["memwatch/host.rss_gib"] for r in printed)
    # One writer: memwatch's W&B sink writes its keys under their own names on the trainer's
    # rows; W&B's transformers callback (which would prefix them "train/") gets none of them.
    history = [r for r in trainer.state.log_history if "loss" in r]
    wanted = set(memwatch_keys(history[0]))
    got = [r for r in data.history if "train/loss" in r]
    assert len(got) == len(history) and len(wanted) >= 5
    missing = [sorted(wanted - set(r)) for r in got]
    assert not any(missing), (missing, [sorted(r) for r in got])
    assert not any(k.startswith("train/memwatch/") for r in data.history for k in r)
    assert any("memwatch/findings/count" in r for r in data.history)  # memwatch's own row
