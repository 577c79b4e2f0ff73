"""Reported leak: threshold metrics computed at every validation end and never reset.

Thread: https://github.com/Lightning-AI/torchmetrics/issues/2921 ("Memory Leak in
BinarPrecisionRecallCurve"), from anomalib#2531. Memory grew for as long as training ran with
anomalib's post-processor. The torchmetrics maintainer found the cause on anomalib's side:
``OneClassPostProcessor.on_validation_epoch_end`` calls ``.compute()`` on its threshold metrics
(subclasses of ``BinaryPrecisionRecallCurve``, whose ``preds``/``target`` states are lists that
grow with every ``update``) and never ``.reset()``; with manual logging the reset is the caller's
job (torchmetrics' docs, written for #1949), so every validation's scores stay in the lists.

Reproduction: a training loop with a validation pass at every epoch end (a quarter as many
batches as training steps) and anomalib's post-processor: after each validation batch it feeds
the per-image scores to ``_image_threshold_metric`` and the per-pixel anomaly map (16 x 16 per
image) to ``_pixel_threshold_metric`` (real torchmetrics ``BinaryPrecisionRecallCurve``
subclasses computing an F1-adaptive threshold); at the validation end it computes both thresholds
and does not reset them. Memory grows only during validation, so the training steps' floors rise
from epoch to epoch and stay flat within each. The holder is the post-processor's
``_pixel_threshold_metric`` (its ``preds`` and ``target`` lists). Fixed twin:
``ho_fix_metric_no_reset`` (the metrics are reset after computing, as the maintainer prescribed).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import BATCH, epochs_loop, plain_step, setup

SOURCE = "https://github.com/Lightning-AI/torchmetrics/issues/2921"
MAP_PIXELS = 16 * 16
VAL_FRACTION = 4  # one validation batch per 4 training steps of the epoch

SCENARIO = Scenario(
    name="ho_rep_metric_no_reset",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="_threshold_metric",
    description="torchmetrics#2921: threshold metrics computed at each validation end, never reset",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): per validation batch, 64
    # maps of 256 float32 scores and int64 targets (192 KiB); one batch per 4 training steps.
    planted_bytes_per_step=49_000,
    source=SOURCE,
    split="heldout",
    reported=True,
)


def _threshold_metric() -> Any:
    from torchmetrics.classification import BinaryPrecisionRecallCurve

    class F1AdaptiveThreshold(BinaryPrecisionRecallCurve):
        """anomalib's threshold: the score that maximises F1 over every value seen."""

        def compute(self) -> torch.Tensor:  # type: ignore[override]
            precision, recall, thresholds = super().compute()
            f1 = 2 * precision * recall / (precision + recall + 1e-10)
            return thresholds[torch.argmax(f1[:-1])]

    return F1AdaptiveThreshold(thresholds=None)


class OneClassPostProcessor:
    """The anomalib callback's hooks that matter here."""

    def __init__(self, resets: bool) -> None:
        self._image_threshold_metric = _threshold_metric()
        self._pixel_threshold_metric = _threshold_metric()
        self.resets = resets
        self.image_threshold = 0.5
        self.pixel_threshold = 0.5

    def on_validation_batch_end(self, anomaly_maps: torch.Tensor, masks: torch.Tensor) -> None:
        self._image_threshold_metric.update(anomaly_maps.amax(dim=1), masks.amax(dim=1))
        self._pixel_threshold_metric.update(anomaly_maps, masks)

    def on_validation_epoch_end(self) -> None:
        self.image_threshold = float(self._image_threshold_metric.compute())
        self.pixel_threshold = float(self._pixel_threshold_metric.compute())
        if self.resets:  # the fix: manual logging resets its metrics
            self._image_threshold_metric.reset()
            self._pixel_threshold_metric.reset()


post_processor: OneClassPostProcessor | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, resets: bool) -> list[list[Any]]:
    global post_processor
    model, opt, data = setup()
    post_processor = pp = OneClassPostProcessor(resets)
    g = torch.Generator().manual_seed(7)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)

    def validate(epoch: int) -> None:
        model.eval()
        with torch.no_grad():
            for _ in range(max(1, steps_per_epoch // VAL_FRACTION)):
                x, _ = data.batch(BATCH)
                anomaly_maps = torch.sigmoid(model.fc1(x))[:, :MAP_PIXELS]
                masks = (torch.rand(BATCH, MAP_PIXELS, generator=g) < 0.1).long()
                pp.on_validation_batch_end(anomaly_maps, masks)
        pp.on_validation_epoch_end()
        model.train()

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=validate)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, resets=False)
