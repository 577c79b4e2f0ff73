"""Timeline: the ring, epoch buckets (checked against a brute-force reference), bounded memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memwatch.timeline import EpochSummary, Timeline


def _reference_buckets(
    x: np.ndarray, steps: np.ndarray, buckets: int
) -> tuple[int, list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]]:
    """Width and (first step, count, floor, peak, last) per bucket, by brute force.

    The width is the smallest power of two that cuts the epoch into fewer than ``buckets``
    buckets (the builder halves as soon as it would hold ``buckets``); buckets are aligned to the
    epoch's first sample and the last one may be partial.
    """
    n = len(x)
    w = 1
    while math.ceil(n / w) >= buckets:
        w *= 2
    out = []
    for j in range(0, n, w):
        rows = x[j : j + w]
        floor = np.array([min(r[c] for r in rows) for c in range(x.shape[1])])
        peak = np.array([max(r[c] for r in rows) for c in range(x.shape[1])])
        out.append((int(steps[j]), len(rows), floor, peak, rows[-1].copy()))
    return w, out


def _check_epoch(ep: EpochSummary, x: np.ndarray, steps: np.ndarray, buckets: int) -> None:
    w, ref = _reference_buckets(x, steps, buckets)
    assert ep.n_steps == len(x)
    assert ep.start_step == steps[0] and ep.end_step == steps[-1]
    assert ep.bucket_count is not None and ep.bucket_step is not None
    assert ep.bucket_floor is not None and ep.bucket_peak is not None
    assert ep.bucket_last is not None
    assert len(ep.bucket_count) == len(ref) < buckets
    assert list(ep.bucket_step) == [r[0] for r in ref]
    assert list(ep.bucket_count) == [r[1] for r in ref]
    assert all(c == w for c in ep.bucket_count[:-1])
    np.testing.assert_array_equal(ep.bucket_floor, np.array([r[2] for r in ref]))
    np.testing.assert_array_equal(ep.bucket_peak, np.array([r[3] for r in ref]))
    np.testing.assert_array_equal(ep.bucket_last, np.array([r[4] for r in ref]))
    np.testing.assert_array_equal(ep.floor, x.min(axis=0))
    np.testing.assert_array_equal(ep.peak, x.max(axis=0))
    np.testing.assert_array_equal(ep.last, x[-1])


@pytest.mark.parametrize("seed", range(4))
def test_buckets_match_a_brute_force_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    capacity, buckets = 64, 8
    tl = Timeline(["a", "b", "c"], capacity=capacity, buckets_per_epoch=buckets,
                  detailed_epochs=100)
    # Short epochs, epochs around the bucket count, and epochs longer than the ring.
    lengths = [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 200, 1000, 1234]
    rng.shuffle(lengths)
    step = 0
    for n in lengths:
        x = rng.normal(size=(n, 3)).cumsum(axis=0) * 1e6 + 1e9
        steps = np.arange(step + 1, step + n + 1)
        for i in range(n):
            tl.append(int(steps[i]), float(steps[i]), list(x[i]))
        step += n
        ep = tl.end_epoch()
        assert ep is not None
        _check_epoch(ep, x, steps, buckets)
        # Even when the epoch is longer than the ring, its true first sample is kept.
        np.testing.assert_array_equal(ep.first, x[0])
        assert ep.t_start == float(steps[0])
    assert tl.n_samples == sum(lengths)
    assert [e.epoch for e in tl.epochs] == list(range(len(lengths)))


def test_default_sizes_halve_many_times() -> None:
    rng = np.random.default_rng(7)
    tl = Timeline(["v"], capacity=1024, buckets_per_epoch=256)
    n = 100_003  # width grows to 512 steps per bucket
    x = rng.integers(0, 1 << 40, size=(n, 1)).astype(np.float64)
    steps = np.arange(n)
    for i in range(n):
        tl.append(i, 0.0, (x[i, 0],))
    ep = tl.end_epoch()
    assert ep is not None
    _check_epoch(ep, x, steps, 256)
    assert ep.bucket_count is not None and ep.bucket_count[0] == 512


def test_a_flush_in_the_middle_of_a_bucket_keeps_it_exact() -> None:
    # capacity 16 flushes every 8 samples while the bucket width is 32: partial reductions merge.
    tl = Timeline(["v"], capacity=16, buckets_per_epoch=4)
    x = np.array([[float((i * 7919) % 101)] for i in range(100)])
    for i in range(100):
        tl.append(i, 0.0, (x[i, 0],))
    ep = tl.end_epoch()
    assert ep is not None
    _check_epoch(ep, x, np.arange(100), 4)


def test_nan_is_ignored_in_floors_and_peaks_unless_everything_is_nan() -> None:
    tl = Timeline(["a", "b"], capacity=16, buckets_per_epoch=4)
    for i in range(10):
        tl.append(i, 0.0, (math.nan if i % 2 else float(i), math.nan))
    ep = tl.end_epoch()
    assert ep is not None
    assert ep.floor[0] == 0.0 and ep.peak[0] == 8.0
    assert math.isnan(ep.floor[1]) and math.isnan(ep.peak[1])
    assert ep.to_dict()["floor"] == {"a": 0.0, "b": None}  # JSON-able: NaN becomes null


def test_ring_wraps_and_keeps_the_last_capacity_samples() -> None:
    tl = Timeline(["v", "w"], capacity=16)
    assert tl.latest() == {} and len(tl) == 0
    for s in range(10):
        tl.append(s, s * 0.5, (float(s), -float(s)))
    steps, vals = tl.series("v")
    assert list(steps) == list(range(10)) and list(vals) == [float(s) for s in range(10)]
    for s in range(10, 40):
        tl.append(s, s * 0.5, (float(s), -float(s)))
    assert len(tl) == 16 and tl.n_samples == 40
    steps, vals = tl.series("w")
    assert list(steps) == list(range(24, 40))
    assert list(vals) == [-float(s) for s in range(24, 40)]
    assert list(tl.times()) == [s * 0.5 for s in range(24, 40)]
    assert tl.latest() == {"v": 39.0, "w": -39.0}
    vals[0] = 123.0  # series returns copies
    assert tl.series("w")[1][0] == -24.0


def test_series_of_the_current_epoch_only() -> None:
    tl = Timeline(["v"], capacity=64)
    for s in range(10):
        tl.append(s, 0.0, (float(s),))
    tl.end_epoch()
    for s in range(10, 15):
        tl.append(s, 0.0, (float(s),))
    assert tl.epoch_samples == 5
    steps, _ = tl.series("v", current_epoch_only=True)
    assert list(steps) == [10, 11, 12, 13, 14]
    cur = tl.current_epoch_buckets()
    assert list(cur["floor"][:, 0]) == [10.0, 11.0, 12.0, 13.0, 14.0]


def test_empty_epoch_is_none() -> None:
    tl = Timeline(["v"], capacity=16)
    assert tl.end_epoch() is None
    tl.append(0, 0.0, (1.0,))
    assert tl.end_epoch() is not None
    assert tl.end_epoch() is None
    assert len(tl.epochs) == 1


def test_epoch_series_and_seconds_per_step() -> None:
    tl = Timeline(["v"], capacity=64, buckets_per_epoch=4)
    for s in range(12):  # width 4 -> three buckets of 4 steps
        tl.append(s, 10.0 + 0.5 * s, (float(s % 4),))
    ep = tl.end_epoch()
    assert ep is not None
    mid, floors = ep.series("v", "floor")
    assert list(mid) == [1, 5, 9] and list(floors) == [0.0, 0.0, 0.0]
    assert list(ep.series("v", "peak")[1]) == [3.0, 3.0, 3.0]
    assert ep.seconds_per_step == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no longer keeps its buckets"):
        ep.compact().series("v")


def test_old_epochs_are_compacted_then_merged_so_memory_stays_bounded() -> None:
    tl = Timeline(["a", "b"], capacity=128, buckets_per_epoch=16, detailed_epochs=3,
                  max_epochs=32)
    sizes = []
    step = 0
    for e in range(400):
        for _ in range(25):
            step += 1
            tl.append(step, float(step), (float(e * 1000 + step % 25), float(-e)))
        tl.end_epoch()
        sizes.append(tl.nbytes())
        assert len(tl.epochs) <= 32 + 1
        detailed = [x for x in tl.epochs if x.bucket_floor is not None]
        assert len(detailed) <= 3 + 1
    # Bounded: the second half of the run never needs more than the first half did.
    assert max(sizes[200:]) <= max(sizes[:200])
    assert max(sizes) < 200_000
    # History stays whole: merged rows cover every step exactly once, in order.
    assert sum(x.n_steps for x in tl.epochs) == 400 * 25
    assert tl.epochs[0].start_step == 1 and tl.epochs[-1].end_step == 400 * 25
    for prev, nxt in zip(tl.epochs, tl.epochs[1:], strict=False):
        assert nxt.start_step == prev.end_step + 1
    # A merged row keeps the floor of everything it covers and the last value of its last epoch.
    first = tl.epochs[0]
    assert first.floor[0] == 0.0 and first.floor[1] == -float(first.n_steps // 25 - 1)
    assert tl.epochs[-1].epoch == 399


def test_restore_epochs_prepends_history_and_continues_numbering() -> None:
    old = Timeline(["v"], capacity=32)
    for e in range(3):
        for s in range(5):
            old.append(e * 5 + s, 0.0, (float(s),))
        old.end_epoch()
    new = Timeline(["v"], capacity=32)
    new.restore_epochs(old.epochs)
    for s in range(5):
        new.append(100 + s, 0.0, (1.0,))
    ep = new.end_epoch()
    assert ep is not None and ep.epoch == 3
    assert [e.epoch for e in new.epochs] == [0, 1, 2, 3]


def test_record_equals_append_whatever_the_slow_values_do() -> None:
    # record() writes the slow columns in bulk (when the background reader publishes new values,
    # and before any read); every read must see what append() of whole rows would have stored.
    keys = ["device.allocated", "host.rss", "host.uss", "workers.uss"]
    a = Timeline(keys, capacity=64, buckets_per_epoch=8)
    b = Timeline(keys, capacity=64, buckets_per_epoch=8, n_fast=2)
    slow = [1.0, 2.0]
    for step in range(1, 301):
        if step % 7 == 0:
            slow = [float(step), float(-step)]  # a new list per poll, as the reader publishes
        fast = (float(step), float(step * 2))
        a.append(step, float(step), [*fast, *slow])
        b.record(step, float(step), fast, slow)
        if step % 50 == 0:
            assert a.latest() == b.latest()
            ra, rb = a.recent(40), b.recent(40)
            assert all(np.array_equal(x, y) for x, y in zip(ra, rb, strict=True))
        if step % 120 == 0:
            ea, eb = a.end_epoch(), b.end_epoch()
            assert ea is not None and eb is not None
            assert np.array_equal(ea.bucket_floor, eb.bucket_floor)
            assert np.array_equal(ea.last, eb.last) and np.array_equal(ea.first, eb.first)
    sa, sb = a.end_segment(), b.end_segment()
    assert sa is not None and sb is not None and np.array_equal(sa.bucket_peak, sb.bucket_peak)
    assert np.array_equal(a.series("host.uss")[1], b.series("host.uss")[1])
