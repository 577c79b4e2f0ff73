"""Issue 41 on a real ``Trainer``: the holder is the user's list, on the first warning.

A ``compute_metrics`` keeping ``p.predictions`` (numpy arrays over the trainer's tensors) in a
module list is named ``EVAL_LOGITS``, never by the tensors' shape, the trainer's
``state.log_history`` or a bundle that does not exist; a ``compute_loss`` keeping
``outputs.logits`` is named ``train_logits``, never through memwatch's own callback (its logger's
closure keeps the trainer) — in the process, and under ``memwatch run``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hf_holder_runs import EVAL_LOGITS, train

from memwatch import MemWatchWarning
from memwatch.integrations.transformers import MemWatchCallback

SCRIPT = Path(__file__).with_name("hf_holder_runs.py")
#: Nothing memwatch owns may appear in a culprit or a fix.
OURS = ("memwatch", "MemWatchCallback", "<lambda>", "log_history", "memwatch inspect")


def _leaks(cb: MemWatchCallback) -> list[Any]:
    leaks = [f for f in cb.findings if f.kind == "leak"]
    assert leaks, [f.to_dict() for f in cb.findings]
    for f in cb.findings:
        said = " ".join([f.culprit or "", *f.suggestions, str(f.evidence.get("holder"))])
        assert not any(o in said for o in OURS), said
    return leaks


@pytest.mark.fresh_process
def test_compute_metrics_keeping_predictions_names_the_users_list_first() -> None:
    EVAL_LOGITS.clear()
    cb = MemWatchCallback(workers=False, total_steps=10_000_000)
    with pytest.warns(MemWatchWarning):
        train("metrics", 5, [cb])
    first = _leaks(cb)[0]
    assert first.severity in ("warning", "critical")
    assert "EVAL_LOGITS (list," in (first.culprit or ""), first.to_dict()
    assert "numpy arrays" in (first.culprit or "")
    assert first.suggestions[0].startswith("`EVAL_LOGITS` "), first.suggestions
    assert first.evidence["holder_name"] == "EVAL_LOGITS"


@pytest.mark.fresh_process
def test_compute_loss_keeping_logits_names_train_logits_first() -> None:
    cb = MemWatchCallback(workers=False, total_steps=10_000_000)
    with pytest.warns(MemWatchWarning):
        train("loss", 3, [cb])
    first = _leaks(cb)[0]
    assert "local trainer.train_logits (list," in (first.culprit or ""), first.to_dict()
    assert first.suggestions[0].startswith("`trainer.train_logits` grows every step")
    # the kept logits' graphs ran backward(): their nodes are held, not saved activations
    assert "backward() already freed" in (first.culprit or ""), first.culprit


def test_under_memwatch_run_the_adapters_closure_is_no_route(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "memwatch", "run", "--check-every-n-steps", "32",
         "--no-workers", "--report", "none", "--", sys.executable, str(SCRIPT), "loss",
         "--epochs", "3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("memwatch")]
    assert run.returncode == 0, run.stderr[-4000:]
    verdicts = [ln for ln in lines if "leak in host." in ln and ": check " in ln]
    assert verdicts and "trainer.train_logits (list," in verdicts[0], lines
    assert not any(o in ln for ln in lines for o in ("MemWatchCallback.__init__", "<lambda>",
                                                      "closure variable `self`")), lines
