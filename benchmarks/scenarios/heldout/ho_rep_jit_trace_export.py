"""Reported leak: tracing the policy for every export leaves each trace in native memory.

Thread: https://github.com/EmbarkStudios/emote/pull/126 ("work around memory leak in
torch.jit.trace", merged), about pytorch/pytorch#82532 and #35600 ("Increased memory usage in
repetitive torch.jit.trace calls"). emote's ONNX exporter callback traced the policy with
``torch.jit.trace(..., check_trace=True)`` at every export during training; the authors measured
that every export leaked ("it unfortunately leaks a full copy of the neural network") and worked
around it by exporting the module without tracing. In the PyTorch threads the maintainers explain
why nothing frees it: traced graphs are registered in one global compilation unit that lives as
long as the process (a design choice, pytorch#43119).

Reproduction: a policy trains on the CPU and a ``PolicyExporter`` callback publishes it every
``EXPORT_EVERY`` steps: eval mode, ``torch.jit.trace`` with ``check_trace=True`` (which traces
again to check), ``torch.jit.save`` to an in-memory buffer, train mode. With torch 2.13 each
export keeps about 0.4 MB of C++ graphs and little else: a dozen Python type objects and
dictionaries, no tensor. No container the user wrote grows; the memory is held by native code.
Fixed twin: ``ho_fix_jit_trace_export`` (the export writes the module's ``state_dict``: no trace).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, IN_DIM, epochs_loop, plain_step, setup

SOURCE = "https://github.com/EmbarkStudios/emote/pull/126"
EXPORT_EVERY = 8

SCENARIO = Scenario(
    name="ho_rep_jit_trace_export",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit=None,
    description="emote#126 / pytorch#82532: torch.jit.trace at every policy export (native)",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): ~0.4 MB of graphs per
    # traced-and-checked export, one export every 8 steps.
    planted_bytes_per_step=48_000,
    source=SOURCE,
    split="heldout",
    reported=True,
)


class PolicyExporter:
    """emote's exporter callback, reduced to what matters: trace (or not) and serialise."""

    def __init__(self, policy: nn.Module, trace: bool) -> None:
        self.policy = policy
        self.trace = trace
        self.example = torch.zeros(BATCH, IN_DIM)
        self.exports = 0
        self.last_size = 0

    def export(self) -> None:
        self.policy.train(False)
        with io.BytesIO() as f:
            if self.trace:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch.jit's deprecation notices
                    traced = torch.jit.trace(self.policy, self.example, check_trace=True,
                                             check_tolerance=1e-05)
                    torch.jit.save(traced, f)
            else:
                torch.save(self.policy.state_dict(), f)  # the workaround: no trace
            self.last_size = f.tell()
        self.policy.train(True)
        self.exports += 1


exporter: PolicyExporter | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, trace: bool) -> list[list[Any]]:
    global exporter
    model, opt, data = setup()
    exporter = exp = PolicyExporter(model, trace)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        if (epoch * steps_per_epoch + i) % EXPORT_EVERY == EXPORT_EVERY - 1:
            exp.export()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, trace=True)
