"""An in-memory sink: keeps what it receives, for tests and for code that reads it directly.

Example::

    >>> import memwatch
    >>> from memwatch.sinks import MemorySink
    >>> from memwatch.testing import FakeDevice
    >>> dev, sink = FakeDevice(total_bytes=2**30), MemorySink()
    >>> with memwatch.watch(device=dev, host=False, workers=False, out_dir=str(tmp),
    ...                     sinks=[sink], log_every_n_steps=10) as mw:
    ...     for step in range(30):
    ...         dev.set(allocated=(step + 1) * 2**20)
    ...         mw.step()
    ...     _ = mw.end_epoch()
    >>> [s for s, _ in sink.metrics], sink.metrics[-1][1]["device.allocated"] / 2**20
    ([10, 20, 30], 30.0)
    >>> len(sink.epochs), [r.at for r in sink.reports], sink.closed
    (1, ['epoch_end'], True)
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.protocols import CheckReport

__all__ = ["MemorySink"]


class MemorySink:
    """Keeps the latest ``maxlen`` events of each kind in lists (bounded like everything else).

    Attributes:
        metrics: ``(step, sample)`` pairs.
        reports: every :class:`memwatch.sinks.CheckReport` (training and evaluation checks).
        epochs: ``(epoch, findings, summary)`` triples of the training checks.
        findings: every finding received, flattened (every stage).
        bundles: ``(path, manifest)`` pairs.
        closed: whether ``close()`` was called.
    """

    def __init__(self, maxlen: int = 10_000) -> None:
        self.maxlen = maxlen
        self.metrics: collections.deque[tuple[int, dict[str, float]]] = collections.deque(
            maxlen=maxlen)
        self.reports: collections.deque[CheckReport] = collections.deque(maxlen=maxlen)
        self.epochs: collections.deque[tuple[int, list[Finding], Any]] = collections.deque(
            maxlen=maxlen)
        self.findings: collections.deque[Finding] = collections.deque(maxlen=maxlen)
        self.bundles: collections.deque[tuple[Path, dict[str, Any]]] = collections.deque(
            maxlen=maxlen)
        self.closed = False

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        self.metrics.append((step, dict(sample)))

    def on_check(self, report: CheckReport) -> None:
        self.reports.append(report)
        if report.stage == "train":
            self.epochs.append((report.epoch, list(report.findings), report.summary))
        self.findings.extend(report.findings)

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self.bundles.append((Path(path), dict(manifest)))

    def close(self) -> None:
        self.closed = True
