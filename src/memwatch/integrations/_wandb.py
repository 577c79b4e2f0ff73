"""One writer of memwatch's keys into W&B, whatever the framework: the memwatch
:class:`memwatch.sinks.wandb.WandbSink`.

A framework's own logging path (Lightning's ``trainer.loggers``, the transformers ``Trainer``'s
``trainer.log`` and its ``report_to`` callbacks, ``accelerator.log``'s trackers) writes memwatch's
keys its own way into W&B: under ``train/`` (transformers' W&B callback prefixes every key but
evaluation ones), at explicit steps that make rows of their own (Accelerate), beside the sink's
keys. So where the program logs to W&B the adapter adds a ``WandbSink`` on that run (unless the
user gave one), and its framework logging path leaves W&B to it; the other loggers (TensorBoard,
CSV, MLflow...) get memwatch's keys as before. A ``WandbSink(series=False)`` the user passed
means the opposite: the framework's path keeps writing the series into W&B.

Nothing here imports a framework or wandb.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["WANDB_TRACKER", "cover_wandb", "sink_writes_wandb"]

#: The name Accelerate gives its W&B tracker.
WANDB_TRACKER = "wandb"


def sink_writes_wandb(sinks: Iterable[Any]) -> bool:
    """A memwatch W&B sink among ``sinks`` writes the series (the framework's path must not)."""
    from memwatch.sinks.wandb import WandbSink

    return any(isinstance(s, WandbSink) and s.series for s in sinks)


def cover_wandb(sinks: Any, run: Any = None, enabled: bool = True) -> bool:
    """Add a :class:`memwatch.sinks.wandb.WandbSink` on ``run`` (a run, a Lightning
    ``WandbLogger``, an Accelerate tracker; None: ``wandb.run``) to the driver's ``sinks``
    unless one is there or ``enabled`` is False; whether memwatch's sink now writes the series
    into W&B (the framework's logging path then leaves W&B to it)."""
    from memwatch.sinks.wandb import WandbSink

    if enabled and not sinks.has(WandbSink):
        sinks.add(WandbSink(run=run))
    return sink_writes_wandb(sinks)
