"""Per-epoch statistics of one metric and the shape of its series.

The shape is decided on bucket floors (minimum per bucket), which removes the sawtooth of
activations and temporaries inside a step: what remains is memory that is *held*.

Shapes: ``flat``, ``growing`` (steady, significant, not levelling off), ``plateau`` (grew, then
levelled off), ``step`` (one jump between flat stretches), ``unknown`` (too few points).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt

from memwatch.analysis.stats.trend import (
    Trend,
    diff_noise,
    median,
    saturation_ratio,
    step_change,
    trend_test,
)
from memwatch.timeline import EpochSummary


@dataclasses.dataclass(frozen=True)
class ShapeConfig:
    alpha: float = 0.01  # Mann–Kendall significance after the autocorrelation correction
    min_growth_bytes: float = 256 * 1024  # an epoch's rise below this is never growth
    min_growth_rel: float = 0.0002  # ... nor below this fraction of the metric's level
    noise_k: float = 4.0  # ... nor below k times the floors' noise
    warmup_fraction: float = 0.1  # of the first epoch, dropped before any trend test
    saturation: float = 0.35  # late-half slope / whole slope below this: levelling off
    step_share: float = 0.7  # a jump carrying this share of the rise is a step change


@dataclasses.dataclass
class EpochStats:
    """One metric in one epoch."""

    epoch: int
    metric: str
    n_points: int
    n_steps: int
    seconds_per_step: float
    level: float
    floor: float  # minimum over the epoch (after warm-up)
    peak: float  # maximum over the epoch (bucket peaks)
    lo_start: float  # floor over the first tenth of the epoch
    lo_end: float  # floor over the last tenth
    rise: float  # lo_end - lo_start
    trend: Trend
    noise: float
    threshold: float
    shape: str
    saturation: float = 1.0
    step_index: int | None = None
    step_height: float = 0.0
    step_at: int | None = None
    #: Which summary these stats are of: ``"e3"`` (epoch 3, or epoch 3 so far), ``"s7"``
    #: (segment 7: the stretch between two checks).
    unit: str = ""
    #: memwatch's own churn (``CheckContext.own_churn``) when this unit was judged.
    own_churn: float = 0.0
    #: :attr:`threshold` before the margin for memwatch's own work at the previous check was
    #: added (what measuring that work may have got wrong); None: no margin was added.
    own_free_threshold: float | None = None
    #: The metric read at the check that closed the unit, after its last step and whatever ran
    #: after it (an evaluation, epoch-end hooks), less the same offset as the unit's levels;
    #: None when not read.
    closing: float | None = None
    #: What ran between the unit's last step and its check ("val", "test"...: an evaluation
    #: loop), when the session was told; None: nothing it knows of.
    after: str | None = None

    @property
    def resolution(self) -> float:
        """The smallest change the unit's own series resolves: its magnitude floors and k
        times its noise, without the margin for memwatch's own work at the previous check
        (which moves the floors between units, not a reading inside one)."""
        return self.threshold if self.own_free_threshold is None else self.own_free_threshold

    @property
    def stair(self) -> float | None:
        """Memory taken after the unit's last step and still there at its check (the closing
        reading above the unit's end floor): what a boundary (an evaluation, an epoch end)
        added. None when the closing reading is unknown."""
        return None if self.closing is None else self.closing - self.lo_end

    @property
    def slope(self) -> float:
        return self.trend.slope

    @property
    def growth(self) -> float:
        """Theil–Sen rise over the epoch's span."""
        return max(self.trend.slope, 0.0) * max(self.n_steps - 1, 1)


def epoch_stats(summary: EpochSummary, metric: str, cfg: ShapeConfig,
                first_epoch: bool, start_step: int | None = None,
                offset: float = 0.0, noise_floor: float = 0.0) -> EpochStats | None:
    """The statistics of ``metric`` over ``summary`` (from ``start_step`` on, when given: the
    part before it is no evidence, e.g. DataLoader workers still starting), its levels lowered
    by ``offset`` (memory memwatch itself added before the unit), its noise at least
    ``noise_floor`` (what the series cannot show of it: :func:`read_noise`)."""
    if metric not in summary.keys or summary.bucket_floor is None:
        return None
    steps, y = summary.series(metric, "floor")
    _, peaks = summary.series(metric, "peak")
    t = steps.astype(np.float64)
    ok = ~np.isnan(y)
    if start_step is not None:
        ok &= steps >= start_step
    t, y, peaks = t[ok], y[ok] - offset, peaks[ok] - offset
    if first_epoch and len(y) >= 10:
        drop = max(1, int(math.ceil(len(y) * cfg.warmup_fraction)))
        t, y, peaks = t[drop:], y[drop:], peaks[drop:]
    n = len(y)
    if n < 6:
        return None
    tr = trend_test(t, y)
    noise = max(tr.noise, diff_noise(y), noise_floor)
    level = median(y)
    threshold = max(cfg.min_growth_bytes, cfg.min_growth_rel * abs(level), cfg.noise_k * noise)
    k = max(2, n // 10)
    lo_start = float(np.min(y[:k]))
    lo_end = float(np.min(y[-k:]))
    span = float(t[-1] - t[0]) if n > 1 else 1.0
    st = EpochStats(
        epoch=summary.epoch,
        metric=metric,
        n_points=n,
        n_steps=summary.n_steps,
        seconds_per_step=summary.seconds_per_step,
        level=level,
        floor=float(np.min(y)),
        peak=float(np.max(peaks)),
        lo_start=lo_start,
        lo_end=lo_end,
        rise=lo_end - lo_start,
        trend=tr,
        noise=noise,
        threshold=threshold,
        shape="flat",
        unit=unit_of(summary),
    )
    rise_fit = tr.slope * span
    # A single jump first. It inflates both the residual noise and the residuals'
    # autocorrelation (so Mann–Kendall under-reports it), and Theil–Sen barely moves on it, so it
    # is judged on its own: the raw rise against the noise of first differences, which a single
    # jump does not disturb.
    jump_thr = max(cfg.min_growth_bytes, cfg.min_growth_rel * abs(level),
                   cfg.noise_k * max(diff_noise(y), noise_floor))
    if st.rise > jump_thr:
        sc = step_change(t, y, cfg.step_share)
        if sc is not None and sc.height > jump_thr:
            st.shape = "step"
            st.step_index = sc.index
            st.step_height = sc.height
            st.step_at = int(t[sc.index])
            return st
    if not (tr.increasing(cfg.alpha) and rise_fit > threshold and st.rise > 0.5 * threshold):
        late = _late_onset(t, y, threshold, cfg)
        if late is None:
            return st
        # Flat, then climbing steadily to the unit's end: growing (saturation is judged on
        # the climb, where a cache filling would level off).
        h = len(y) // 2
        st.saturation = saturation_ratio(t[h:], y[h:], late)
        st.shape = "plateau" if st.saturation < cfg.saturation else "growing"
        return st
    st.saturation = saturation_ratio(t, y, tr)
    st.shape = "plateau" if st.saturation < cfg.saturation else "growing"
    return st


def _late_onset(t: npt.NDArray[np.float64], y: npt.NDArray[np.float64], threshold: float,
                cfg: ShapeConfig) -> Trend | None:
    """The second half's trend when that half climbs steadily by more than the threshold (the
    same trend test, same significance, on that half alone, at least 12 points, so 6 or more
    in it; its floors over its first and last fifth apart by more than the threshold), else
    None.

    A leak's RSS stands still while the allocator hands out memory the process freed before
    (glibc's free lists, a census's scratch) and climbs once that is used up. Judged whole, such
    a unit is flat: the stall's points outnumber the climb's, and the climb's residuals, strongly
    correlated after the stall, shrink Mann-Kendall's effective sample size (a resumed run's
    unit stood still 12-16 steps, then rose 18 MiB against a 1.6 MiB threshold, and measured
    p = 0.04)."""
    n = len(y)
    if n < 12:
        return None
    h = n // 2
    late = trend_test(t[h:], y[h:])
    k = max(2, (n - h) // 5)
    climbed = float(np.min(y[-k:])) - float(np.min(y[h:h + k]))
    if late.increasing(cfg.alpha) and late.slope * float(t[-1] - t[h]) > threshold and \
            climbed > threshold:
        return late
    return None


def read_noise(swing: float, reads: int) -> float:
    """The noise of a unit's floor taken from ``reads`` readings of a metric that swings by
    ``swing`` inside the unit.

    A metric read in the background (a pass every few seconds) repeats its last reading between
    passes, so its series shows no noise however much it moves: a unit of 4 s holds one
    reading, taken wherever the metric stood in its swing (RSS's parts rise and fall with the
    step's temporaries), and its "floor" is that reading. Readings at independent moments,
    each uniform over the swing: the least of ``r`` of them lies above the true floor by
    ``swing / (r + 1)`` on average, with a standard deviation of
    ``swing * sqrt(r) / ((r + 1) * sqrt(r + 2))`` (0.29 of the swing for one reading, 0.14
    for five, 0.05 for twenty): that is the unit's noise. A floor climb between such units is
    then judged against what the readings can resolve, not against the zero noise of repeated
    values (a clean Lightning fit's ``host.rss_anon``, one reading a 4-s epoch, climbed 97
    and 42 MiB inside a swing of 40-200 MiB)."""
    if swing <= 0 or reads <= 0:
        return 0.0
    return swing * math.sqrt(reads) / ((reads + 1) * math.sqrt(reads + 2))


def unit_of(summary: EpochSummary) -> str:
    """``"s<segment>"`` for a check's segment, ``"e<epoch>"`` for an epoch (or one so far)."""
    return f"s{summary.segment}" if summary.segment is not None else f"e{summary.epoch}"


def last_value(summary: EpochSummary, key: str) -> float | None:
    """``key``'s last sample in ``summary`` (None when absent or NaN)."""
    if key not in summary.keys:
        return None
    v = float(summary.last[summary.keys.index(key)])
    return None if math.isnan(v) else v


def delta(summary: EpochSummary, key: str) -> float:
    """How much ``key`` changed over ``summary`` (0 when absent or NaN): counters."""
    if key not in summary.keys:
        return 0.0
    i = summary.keys.index(key)
    v = float(summary.last[i] - summary.first[i])
    return 0.0 if math.isnan(v) else v
