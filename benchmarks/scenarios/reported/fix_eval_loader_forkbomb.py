"""Fixed twin of ``rep_eval_loader_forkbomb``: the eval DataLoader is created once and reused.

Thread: https://github.com/huggingface/transformers/issues/28469 (fixed by transformers PR 29538
and PR 39717: keep the prepared eval DataLoader when persistent workers are on). Same trainer and
loop; ``get_eval_dataloader`` returns the cached loader after the first evaluation, so the same
two persistent workers serve every evaluation: ``workers.count`` stays at 2 and their USS levels
off after the first pass. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_eval_loader_forkbomb import SOURCE, _run

SCENARIO = Scenario(
    name="fix_eval_loader_forkbomb",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="transformers#28469 fixed: one cached persistent-worker eval DataLoader",
    expected_kind="none",
    workers=True,
    source=SOURCE,
    twin_of="rep_eval_loader_forkbomb",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
