"""Fixed twin of ``ho_rep_jit_trace_export``: the export serialises the module without tracing it.

Thread: https://github.com/EmbarkStudios/emote/pull/126 (the workaround: export the module
directly instead of a ``torch.jit.trace`` of it). Same policy, loop and export cadence; each
export writes the policy's ``state_dict`` to the buffer, so no graph is registered. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_jit_trace_export import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_jit_trace_export",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="emote#126 fixed: exports write the state_dict, nothing traced",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_jit_trace_export",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, trace=False)
