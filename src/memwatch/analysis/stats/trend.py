"""Robust trend statistics in pure numpy.

* Mann–Kendall trend test with the Yue–Wang effective-sample-size correction for lag-1
  autocorrelation (memory series are strongly autocorrelated: a plain MK test calls trends on
  random walks).
* Theil–Sen slope (median of pairwise slopes) with Sen's distribution-free confidence interval.
* A single-jump (step change) detector and a saturation (plateau) test.

Everything works on bucket floors (at most a few hundred points per epoch), so the O(n^2) pairwise
statistics cost well under a millisecond; :func:`bucket` reduces long raw series first.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

def dominant(n: int) -> float:
    """How many times its largest residual a rise over ``n`` points must be to be a trend
    whatever the residuals' correlation (:attr:`Trend.dominance`): the value that 0.1% of random
    walks reach (a null stricter than the Mann–Kendall test's 1%). Simulated, 4,000 walks per
    length: 14.4 at 6 points, 9.8 at 8, 8.8 at 12, 7.3 at 24, 7.8 at 36, 7.3 at 64, 6.2 at 128,
    6.0 at 256."""
    return 15.0 if n < 8 else 10.0 if n < 16 else 8.0

_Z = {0.90: 1.6448536, 0.95: 1.9599640, 0.99: 2.5758293}


def bucket(values: npt.ArrayLike, n_buckets: int = 256) -> tuple[FloatArray, FloatArray]:
    """Split a raw series into ``n_buckets`` equal buckets: (mid index, floor) per bucket."""
    y: FloatArray = np.asarray(values, dtype=np.float64)
    n = len(y)
    if n <= n_buckets:
        return np.arange(n, dtype=np.float64), y.copy()
    edges = np.linspace(0, n, n_buckets + 1).astype(np.int64)
    floors = np.fmin.reduceat(y, edges[:-1])
    mids = (edges[:-1] + edges[1:] - 1) / 2.0
    return mids.astype(np.float64), floors


@dataclasses.dataclass(frozen=True)
class Trend:
    """Result of :func:`trend_test`."""

    n: int
    s: float  # Mann–Kendall S
    z: float
    p: float  # two-sided p-value after the autocorrelation correction
    slope: float  # Theil–Sen, units of y per unit of t
    slope_low: float  # confidence interval of the slope
    slope_high: float
    intercept: float
    r1: float  # lag-1 autocorrelation of the detrended residuals
    noise: float  # robust std of residuals around the Theil–Sen line
    #: The fitted rise over the span, in units of the largest residual (how far any point
    #: strays from the line). A random walk strays about as far as it rises; see
    #: :func:`dominant`.
    dominance: float = 0.0

    def increasing(self, alpha: float = 0.01) -> bool:
        """A significant upward trend: Mann–Kendall's p under ``alpha`` (autocorrelation
        corrected) with the slope's interval above zero, or a rise that dominates the residuals
        (:func:`dominant`). The second covers near-deterministic ramps and staircases: the
        residuals of a leak that grows by the same bytes every step are tiny and often
        correlated (page rounding), and the lag-1 correction, made for noise, then divides the
        effective sample size by up to ``n``: the same 1 MiB/step ramp of 36 points measured
        p = 1e-17 in one run and p = 0.03 in the next."""
        if self.s <= 0:
            return False
        return (self.p < alpha and self.slope_low > 0) or self.dominance >= dominant(self.n)


@functools.lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    # Pair indices are the same for every series of one length: build them once.
    i, j = np.triu_indices(n, k=1)
    i.setflags(write=False)
    j.setflags(write=False)
    return i, j


def median(values: FloatArray) -> float:
    """The median of a 1-D array without NaNs (every caller here drops them first), by
    ``np.partition`` alone: ``np.median`` checks for NaNs through ``numpy.ma``, whose import its
    first call pays (20 ms, in a run's first check), and costs 15-30 us a call in dispatch; a
    check takes about a hundred medians."""
    n = len(values)
    if n == 0:
        return math.nan
    k = n // 2
    if n % 2:
        return float(np.partition(values, k)[k])
    part = np.partition(values, (k - 1, k))
    return (float(part[k - 1]) + float(part[k])) / 2.0


def _ranked(values: FloatArray, ranks: list[int]) -> dict[int, float]:
    """Order statistics at ``ranks`` in O(n) (np.partition), without a full sort."""
    m = len(values)
    kth = sorted({r for r in ranks if 0 <= r < m})
    if not kth:
        return {}
    part = np.partition(values, kth)
    return {r: float(part[r]) for r in kth}


def trend_test(t_in: npt.ArrayLike, y_in: npt.ArrayLike, confidence: float = 0.95) -> Trend:
    """Mann–Kendall + Theil–Sen on ``y`` against ``t`` (NaNs dropped)."""
    t: FloatArray = np.asarray(t_in, dtype=np.float64)
    y: FloatArray = np.asarray(y_in, dtype=np.float64)
    ok = ~(np.isnan(t) | np.isnan(y))
    if not ok.all():
        t, y = t[ok], y[ok]
    n = len(y)
    if n < 4:
        return Trend(n, 0.0, 0.0, 1.0, 0.0, -math.inf, math.inf, float(y[0]) if n else 0.0,
                     0.0, 0.0)
    if t[-1] > t[0] and y.min() == y.max():
        # A constant series (a metric read in the background holds one reading across a short
        # unit): no pair differs, Var(S) is all ties, the slope and every residual are 0. What
        # the pairs would give (_pairwise), without building n(n-1)/2 of them.
        return Trend(n, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, float(y[0]), 0.0, 0.0, 0.0)
    return _pairwise(t, y, confidence)


def _pairwise(t: FloatArray, y: FloatArray, confidence: float) -> Trend:
    """Mann–Kendall and Theil–Sen from every pair of points (``n >= 4``, no NaNs)."""
    n = len(y)
    i, j = _pairs(n)
    dt = t[j] - t[i]
    dy = y[j] - y[i]
    s = float(np.count_nonzero(dy > 0) - np.count_nonzero(dy < 0))
    # Variance of S with the correction for tied values (memory series have many ties).
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1]
    var_s = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    valid = dt > 0
    slopes = dy / dt if valid.all() else dy[valid] / dt[valid]
    m = len(slopes)
    if m == 0:
        return Trend(n, s, 0.0, 1.0, 0.0, -math.inf, math.inf, median(y), 0.0, 0.0)
    # Sen's confidence interval needs Var(S) after the autocorrelation correction, which needs
    # the residuals, which need the slope: compute the median first.
    slope = median(slopes)
    intercept = median(y - slope * t)
    resid = y - (intercept + slope * t)
    r1 = _lag1(resid)
    # Yue & Wang (2004): inflate Var(S) by n/n* for AR(1) residuals with positive correlation.
    if r1 > 0:
        k = np.arange(1, n)
        factor = 1.0 + 2.0 * float(((1 - k / n) * r1**k).sum())
        var_s *= max(factor, 1.0)
    noise = 1.4826 * median(np.abs(resid - median(resid)))
    stray = float(np.max(np.abs(resid)))
    rise = slope * float(t[-1] - t[0])
    dominance = rise / stray if stray > 0 else (math.inf if rise > 0 else 0.0)
    if var_s <= 0:
        return Trend(n, s, 0.0, 1.0, slope, slope, slope, intercept, r1, noise, dominance)
    z = (s - math.copysign(1.0, s)) / math.sqrt(var_s) if s != 0 else 0.0
    p = math.erfc(abs(z) / math.sqrt(2.0))
    # Sen's confidence interval: ranks of the sorted pairwise slopes around the median.
    za = _Z.get(confidence, 1.9599640)
    c = za * math.sqrt(var_s)
    lo_rank = int(math.floor((m - c) / 2.0))
    hi_rank = int(math.ceil((m + c) / 2.0))
    ci = _ranked(slopes, [lo_rank, hi_rank])
    slope_low = ci.get(lo_rank, -math.inf)
    slope_high = ci.get(hi_rank, math.inf)
    return Trend(n, s, z, p, slope, slope_low, slope_high, intercept, r1, noise, dominance)


def _lag1(x: FloatArray) -> float:
    x = x - x.mean()
    den = float((x * x).sum())
    if den <= 0:
        return 0.0
    return float((x[:-1] * x[1:]).sum() / den)


def diff_noise(y_in: npt.ArrayLike) -> float:
    """Robust noise scale from first differences (insensitive to trends and single jumps)."""
    y: FloatArray = np.asarray(y_in, dtype=np.float64)
    y = y[~np.isnan(y)]
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    return 1.4826 * median(np.abs(d - median(d))) / math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class StepChange:
    index: int  # first point after the jump
    height: float
    share: float  # jump height / total rise of the series
    before_flat: bool
    after_flat: bool


def step_change(t: FloatArray, y: FloatArray, min_share: float = 0.7) -> StepChange | None:
    """A single jump between otherwise flat stretches, or ``None``.

    The jump is the split point that maximises the difference of medians either side; the series
    is a step change when that jump carries at least ``min_share`` of the whole rise and neither
    side trends upwards on its own.
    """
    n = len(y)
    if n < 8:
        return None
    best_i, best_h = -1, 0.0
    # Candidate split points: the largest positive single differences (cheap, and a real step
    # shows up as one big difference between adjacent floors).
    d = np.diff(y)
    for i in np.argsort(d)[::-1][:5] + 1:
        if i < 2 or i > n - 2:
            continue
        h = median(y[i:]) - median(y[:i])
        if h > best_h:
            best_i, best_h = int(i), h
    if best_i < 0 or best_h <= 0:
        return None
    rise = float(np.max(y) - np.min(y))
    if rise <= 0:
        return None
    share = best_h / rise
    before = trend_test(t[:best_i], y[:best_i]) if best_i >= 4 else None
    after = trend_test(t[best_i:], y[best_i:]) if n - best_i >= 4 else None
    before_flat = before is None or not _significant_rise(before, t[:best_i], best_h)
    after_flat = after is None or not _significant_rise(after, t[best_i:], best_h)
    if share < min_share or not (before_flat and after_flat):
        return None
    return StepChange(best_i, best_h, share, before_flat, after_flat)


def _significant_rise(tr: Trend, t: FloatArray, scale: float) -> bool:
    """Trend significant and its total rise over ``t`` at least a fifth of ``scale``."""
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    return tr.increasing(0.01) and tr.slope * span > 0.2 * scale


def saturation_ratio(t: FloatArray, y: FloatArray, whole: Trend | None = None) -> float:
    """Slope of the last half over slope of the whole: ~1 for steady growth, ~0 when levelling off.

    Uses Theil–Sen on each part. Returns 1.0 when the whole shows no rise.
    """
    n = len(y)
    if n < 8:
        return 1.0
    if whole is None:
        whole = trend_test(t, y)
    if whole.slope <= 0:
        return 1.0
    h = n // 2
    late = trend_test(t[h:], y[h:])
    return late.slope / whole.slope
