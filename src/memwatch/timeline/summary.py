"""What one epoch (or the stretch between two checks) of a timeline leaves behind: compact
figures per metric, plus its buckets while it is recent (:class:`EpochSummary`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["EpochSummary", "FloatArray", "IntArray", "merge"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclasses.dataclass
class EpochSummary:
    """One epoch of one timeline: compact figures per metric, plus buckets while recent."""

    epoch: int
    start_step: int
    end_step: int  # inclusive: the step index of the epoch's last sample
    n_steps: int
    t_start: float
    t_end: float
    keys: tuple[str, ...]
    floor: FloatArray  # (M,)
    peak: FloatArray  # (M,)
    first: FloatArray  # (M,)
    last: FloatArray  # (M,)
    bucket_step: IntArray | None = None  # (B,) step index of each bucket's first sample
    bucket_count: IntArray | None = None  # (B,)
    bucket_floor: FloatArray | None = None  # (B, M)
    bucket_peak: FloatArray | None = None  # (B, M)
    bucket_last: FloatArray | None = None  # (B, M)
    #: For the summary of a check's segment (the stretch since the previous check): its index
    #: among the run's segments; None for an epoch.
    segment: int | None = None
    #: The metrics read in the background (a pass every few seconds, and at a unit's first
    #: step), not with every sample: between two passes their rows repeat the last reading.
    slow_keys: tuple[str, ...] = ()
    #: Background passes whose readings reached this summary's rows.
    slow_reads: int = 0

    def col(self, key: str) -> int:
        return self.keys.index(key)

    def series(self, key: str, what: str = "floor") -> tuple[IntArray, FloatArray]:
        """(bucket mid steps, bucket floors|peaks|lasts) of ``key`` in this epoch."""
        if self.bucket_step is None or self.bucket_count is None:
            raise ValueError(f"epoch {self.epoch} no longer keeps its buckets")
        arr = {"floor": self.bucket_floor, "peak": self.bucket_peak, "last": self.bucket_last}[what]
        assert arr is not None
        mid = self.bucket_step + (self.bucket_count - 1) // 2
        return mid, arr[:, self.col(key)]

    def reads(self, key: str) -> int | None:
        """How many distinct readings of ``key`` the summary's rows hold: None for a metric read
        with every sample, else the background passes that reached them (at least 1: rows
        with no pass of their own repeat one reading taken before them)."""
        return max(self.slow_reads, 1) if key in self.slow_keys else None

    @property
    def seconds_per_step(self) -> float:
        return (self.t_end - self.t_start) / max(self.n_steps - 1, 1)

    def compact(self) -> EpochSummary:
        return dataclasses.replace(self, bucket_step=None, bucket_count=None, bucket_floor=None,
                                   bucket_peak=None, bucket_last=None)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "epoch": self.epoch,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "n_steps": self.n_steps,
            "t_start": self.t_start,
            "t_end": self.t_end,
        }
        for name in ("floor", "peak", "first", "last"):
            arr = getattr(self, name)
            d[name] = {k: _jsonable(arr[i]) for i, k in enumerate(self.keys)}
        return d


def _jsonable(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def merge(a: EpochSummary, b: EpochSummary) -> EpochSummary:
    """Two consecutive units as one: compact epochs (old history, kept whole in bounded
    memory), or two segments that keep their buckets (their buckets one after the other)."""
    buckets: dict[str, Any] = {}
    if a.bucket_step is not None and b.bucket_step is not None:
        for name in ("bucket_step", "bucket_count", "bucket_floor", "bucket_peak",
                     "bucket_last"):
            buckets[name] = np.concatenate([getattr(a, name), getattr(b, name)])
        buckets["segment"] = a.segment
    return EpochSummary(
        epoch=a.epoch,
        start_step=a.start_step,
        end_step=b.end_step,
        n_steps=a.n_steps + b.n_steps,
        t_start=a.t_start,
        t_end=b.t_end,
        keys=a.keys,
        floor=np.fmin(a.floor, b.floor),
        peak=np.fmax(a.peak, b.peak),
        first=a.first,
        last=b.last,
        slow_keys=a.slow_keys,
        slow_reads=a.slow_reads + b.slow_reads,
        **buckets,
    )
