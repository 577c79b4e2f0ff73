"""A fixed-memory columnar store of per-step samples.

Two layers, both bounded whatever the run length:

* a ring of the last ``capacity`` raw samples (one row per ``step()``, one column per metric);
* per-epoch bucket summaries: each epoch's series is cut into at most ``buckets_per_epoch``
  buckets of equal width; each bucket keeps its floor (minimum: removes the intra-step sawtooth of
  activations and temporaries), its peak (maximum: what forecasts to OOM need) and its last value.
  The width is not known in advance (epoch length is not), so it starts at one step and doubles
  (merging neighbours pairwise) whenever the buckets fill up.

Recent epochs keep their buckets; older ones keep one compact row each (floor, peak, first, last),
and past ``max_epochs`` compact rows the oldest are merged pairwise.

Checks inside long epochs (``MemWatch(check_every_n_steps=...)``) cut the series into *segments*:
the stretch since the previous check. The timeline keeps the segment in progress in a second
set of buckets, so that a segment of a 100k-step epoch is as finely resolved as a short epoch, and
can summarise the epoch in progress without closing it (:meth:`Timeline.epoch_so_far`).

The hot path (:meth:`Timeline.record`) writes the per-step values as scalars (the background
values only when they change); bucket reduction happens in vectorised chunks every few steps, so
its amortised cost is a fraction of a microsecond. What an epoch leaves behind:
:class:`~memwatch.timeline.summary.EpochSummary`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from memwatch.timeline.summary import EpochSummary, FloatArray, IntArray, merge


class _BucketBuilder:
    """Builds the buckets of the epoch in progress."""

    def __init__(self, m: int, max_buckets: int) -> None:
        if max_buckets < 4 or max_buckets % 2:
            raise ValueError("buckets_per_epoch must be an even number >= 4")
        self.m = m
        self.max = max_buckets
        self.floor = np.full((max_buckets, m), np.nan)
        self.peak = np.full((max_buckets, m), np.nan)
        self.last = np.full((max_buckets, m), np.nan)
        self.step = np.zeros(max_buckets, dtype=np.int64)
        self.count = np.zeros(max_buckets, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self.nb = 0
        self.width = 1
        self.cur_count = 0
        self.cur_step = 0
        self.cur_floor = np.full(self.m, np.nan)
        self.cur_peak = np.full(self.m, np.nan)
        self.cur_last = np.full(self.m, np.nan)

    def add(self, rows: FloatArray, steps: IntArray) -> None:
        i = 0
        n = len(rows)
        while i < n:
            take = min(n - i, self.width - self.cur_count)
            chunk = rows[i : i + take]
            if self.cur_count == 0:
                self.cur_step = int(steps[i])
                self.cur_floor = np.fmin.reduce(chunk, axis=0)
                self.cur_peak = np.fmax.reduce(chunk, axis=0)
            else:
                np.fmin(self.cur_floor, np.fmin.reduce(chunk, axis=0), out=self.cur_floor)
                np.fmax(self.cur_peak, np.fmax.reduce(chunk, axis=0), out=self.cur_peak)
            self.cur_last = chunk[-1].copy()
            self.cur_count += take
            i += take
            if self.cur_count == self.width:
                self._close_bucket()

    def _close_bucket(self) -> None:
        if self.cur_count == 0:
            return
        if self.nb == self.max:
            self._halve()
        b = self.nb
        self.floor[b] = self.cur_floor
        self.peak[b] = self.cur_peak
        self.last[b] = self.cur_last
        self.step[b] = self.cur_step
        self.count[b] = self.cur_count
        self.nb += 1
        self.cur_count = 0
        if self.nb == self.max:
            self._halve()

    def _halve(self) -> None:
        h = self.max // 2
        self.floor[:h] = np.fmin(self.floor[0::2], self.floor[1::2])
        self.peak[:h] = np.fmax(self.peak[0::2], self.peak[1::2])
        self.last[:h] = self.last[1::2]
        self.step[:h] = self.step[0::2]
        self.count[:h] = self.count[0::2] + self.count[1::2]
        self.nb = h
        self.width *= 2

    def finish(self) -> tuple[IntArray, IntArray, FloatArray, FloatArray, FloatArray]:
        self._close_bucket()
        nb = self.nb
        return (self.step[:nb].copy(), self.count[:nb].copy(), self.floor[:nb].copy(),
                self.peak[:nb].copy(), self.last[:nb].copy())

    def snapshot(self) -> tuple[IntArray, IntArray, FloatArray, FloatArray, FloatArray]:
        """What :meth:`finish` would return, without closing the bucket in progress."""
        nb = self.nb
        arrays = [self.step[:nb], self.count[:nb], self.floor[:nb], self.peak[:nb],
                  self.last[:nb]]
        if self.cur_count:
            cur = (self.cur_step, self.cur_count, self.cur_floor, self.cur_peak, self.cur_last)
            arrays = [np.concatenate([a, np.asarray([c], dtype=a.dtype)]) for a, c in
                      zip(arrays, cur, strict=True)]
        else:
            arrays = [a.copy() for a in arrays]
        return arrays[0], arrays[1], arrays[2], arrays[3], arrays[4]


class _Span:
    """The samples since a boundary (an epoch end, or a check): their buckets, and their first
    sample (captured at the first flush: a span longer than the ring would lose it)."""

    def __init__(self, m: int, max_buckets: int) -> None:
        self.builder = _BucketBuilder(m, max_buckets)
        self.first_n = 0  # the sample number the span starts at
        self.first: tuple[FloatArray, int, float] | None = None
        self.slow_reads = 0  # background passes published since the span began

    def reset(self, first_n: int) -> None:
        self.builder.reset()
        self.first_n = first_n
        self.first = None
        self.slow_reads = 0


class Timeline:
    """Columnar, fixed-memory store of per-step samples.

    Example::

        >>> from memwatch.timeline import Timeline
        >>> tl = Timeline(["host.rss"], capacity=1024)
        >>> for s in range(100):
        ...     tl.append(s, float(s), [1000.0 + s])
        >>> ep = tl.end_epoch()
        >>> float(ep.floor[0]), float(ep.peak[0]), ep.n_steps
        (1000.0, 1099.0, 100)
    """

    def __init__(
        self,
        keys: Sequence[str],
        capacity: int = 32768,
        buckets_per_epoch: int = 256,
        detailed_epochs: int = 8,
        max_epochs: int = 1024,
        n_fast: int | None = None,
    ) -> None:
        if capacity < 16:
            raise ValueError(f"capacity must be >= 16, got {capacity}")
        self.keys: tuple[str, ...] = tuple(keys)
        self._col = {k: i for i, k in enumerate(self.keys)}
        m = len(self.keys)
        self.capacity = int(capacity)
        self._data = np.full((self.capacity, m), np.nan)
        self._steps = np.zeros(self.capacity, dtype=np.int64)
        self._times = np.zeros(self.capacity, dtype=np.float64)
        self._n = 0  # samples appended, ever
        self._flushed = 0  # samples already reduced into buckets
        # record(): the first ``n_fast`` columns come with every sample; the others are the
        # background reader's values, which change once per poll: they are written in bulk
        # (rows [_slow_from, _n) get _slow) when they change or before the rows are reduced.
        self._n_fast = m if n_fast is None else int(n_fast)
        self._slow: Sequence[float] | None = None
        self._slow_src: Sequence[float] | None = None  # the reader's list _slow was made from
        #: Called with the background reader's new values when they first reach a sample
        #: (once per pass, on the recording thread); returns the values to store. The session
        #: reads the C allocator's bytes again there, at the step (Sampling._at_step).
        self.restate: Callable[[Sequence[float]], Sequence[float]] | None = None
        self._slow_from = 0
        self._flush_every = min(256, self.capacity // 2)
        self._epoch = _Span(m, buckets_per_epoch)  # the epoch in progress
        self._segment = _Span(m, buckets_per_epoch)  # the stretch since the last check
        self._segment_index = 0
        self.detailed_epochs = detailed_epochs
        self.max_epochs = max_epochs
        self.epochs: list[EpochSummary] = []
        self._epoch_index = 0

    # ------------------------------------------------------------------ hot path
    def append(self, step: int, t: float, values: Sequence[float]) -> None:
        """Store one sample (every column). O(1); the vectorised bucket reduction runs every few
        calls."""
        self._fill_slow()
        i = self._n % self.capacity
        self._data[i] = values
        self._steps[i] = step
        self._times[i] = t
        self._n += 1
        self._slow_from = self._n
        if self._n - self._flushed >= self._flush_every:
            self._flush()

    def record(self, step: int, t: float, fast: Sequence[float],
               slow: Sequence[float]) -> None:
        """Store one sample from its parts: ``fast`` for the first ``n_fast`` columns, ``slow``
        for the rest. ``slow`` is the background reader's published list, replaced (never
        mutated) at each poll: while it is the same object the slow columns are not written
        per sample, only when it changes and before the rows are read. O(1), and a few scalar
        writes instead of converting a list into a numpy row."""
        if slow is not self._slow_src:
            self._fill_slow()  # the rows so far get the values they were taken with
            self._slow_src = slow
            if self.restate is not None:
                slow = self.restate(slow)
            self._slow = slow
            if any(v == v for v in slow):  # a pass's readings (not the NaN before the first)
                self._epoch.slow_reads += 1
                self._segment.slow_reads += 1
        i = self._n % self.capacity
        d = self._data
        j = 0
        for v in fast:
            d[i, j] = v
            j += 1
        if j != self._n_fast:  # the row is not counted: the caller's recovery finds the probe
            raise ValueError(f"a sample of {j} fast values for {self._n_fast} fast columns")
        self._steps[i] = step
        self._times[i] = t
        self._n += 1
        if self._n - self._flushed >= self._flush_every:
            self._flush()

    def _fill_slow(self) -> None:
        """Write the slow columns of the rows recorded since they were last written."""
        a, b, slow = self._slow_from, self._n, self._slow
        self._slow_from = b
        if slow is None or b <= a or self._n_fast >= len(self.keys):
            return
        vals = np.asarray(slow, dtype=np.float64)
        a = max(a, b - self.capacity)
        i, k = a % self.capacity, b - a
        nf = self._n_fast
        if i + k <= self.capacity:
            self._data[i:i + k, nf:] = vals
        else:
            self._data[i:, nf:] = vals
            self._data[:i + k - self.capacity, nf:] = vals

    def _pending_slow(self, rows: FloatArray, start_n: int) -> FloatArray:
        """``rows`` (samples from ``start_n`` on) with the slow values not yet written: a read
        never writes the ring (other threads read it too)."""
        a, slow = self._slow_from, self._slow
        if slow is None or a >= start_n + len(rows) or self._n_fast >= len(self.keys):
            return rows
        rows = rows.copy()
        rows[max(a - start_n, 0):, self._n_fast:] = np.asarray(slow, dtype=np.float64)
        return rows

    # ------------------------------------------------------------------ epochs
    def _rows(self, start_n: int, end_n: int) -> tuple[FloatArray, IntArray, FloatArray]:
        """Raw rows for sample numbers [start_n, end_n) (must still be in the ring)."""
        # Clamp to what the ring still holds (and to 0 before it has wrapped once).
        start_n = max(start_n, self._n - self.capacity, 0)
        if end_n <= start_n:
            empty = np.empty((0, len(self.keys)))
            return empty, np.empty(0, dtype=np.int64), np.empty(0)
        a, k = start_n % self.capacity, end_n - start_n
        if a + k <= self.capacity:
            sl = slice(a, a + k)
            return self._pending_slow(self._data[sl], start_n), self._steps[sl], self._times[sl]
        idx = np.r_[a : self.capacity, 0 : a + k - self.capacity]
        return self._pending_slow(self._data[idx], start_n), self._steps[idx], self._times[idx]

    def _flush(self) -> None:
        self._fill_slow()
        rows, steps, _ = self._rows(self._flushed, self._n)
        if len(rows):
            for span in (self._epoch, self._segment):
                span.builder.add(rows, steps)
                if span.first is None:
                    span.first = self._first_of(span.first_n)
        self._flushed = self._n

    @property
    def n_samples(self) -> int:
        return self._n

    @property
    def epoch_samples(self) -> int:
        """Samples in the epoch in progress."""
        return self._n - self._epoch.first_n

    @property
    def segment_samples(self) -> int:
        """Samples since the last check (:meth:`end_segment`) or epoch end."""
        return self._n - self._segment.first_n

    def end_epoch(self) -> EpochSummary | None:
        """Close the epoch in progress (and the segment in progress); ``None`` when it has no
        sample."""
        summary = self._summary(self._epoch, None, close=True)
        if summary is None:
            return None
        self._epoch.reset(self._n)
        self._segment.reset(self._n)
        self._epoch_index += 1
        self.epochs.append(summary)
        self._bound_epochs()
        return summary

    def end_segment(self) -> EpochSummary | None:
        """Close the segment in progress (the samples since the last check or epoch end) and
        return its summary (``segment`` set; ``epoch`` the epoch it lies in); ``None`` when it
        has no sample. Segments are not kept: the caller judges them."""
        summary = self._summary(self._segment, self._segment_index, close=True)
        if summary is None:
            return None
        self._segment.reset(self._n)
        self._segment_index += 1
        return summary

    def epoch_so_far(self) -> EpochSummary | None:
        """The epoch in progress, summarised without closing it (``None`` before its first
        sample)."""
        return self._summary(self._epoch, None, close=False)

    def _summary(self, span: _Span, segment: int | None, close: bool) -> EpochSummary | None:
        self._flush()
        n0, n1 = span.first_n, self._n
        if n1 == n0:
            return None
        b = span.builder
        bstep, bcount, bfloor, bpeak, blast = b.finish() if close else b.snapshot()
        first_row, first_step, first_t = span.first or self._first_of(n0)
        last_i = (n1 - 1) % self.capacity
        return EpochSummary(
            epoch=self._epoch_index,
            start_step=first_step,
            end_step=int(self._steps[last_i]),
            n_steps=n1 - n0,
            t_start=first_t,
            t_end=float(self._times[last_i]),
            keys=self.keys,
            floor=np.fmin.reduce(bfloor, axis=0),
            peak=np.fmax.reduce(bpeak, axis=0),
            first=first_row,
            last=self._data[last_i].copy(),
            bucket_step=bstep,
            bucket_count=bcount,
            bucket_floor=bfloor,
            bucket_peak=bpeak,
            bucket_last=blast,
            segment=segment,
            slow_keys=self.keys[self._n_fast:],
            slow_reads=span.slow_reads,
        )

    def _first_of(self, first_n: int) -> tuple[FloatArray, int, float]:
        rows, steps, times = self._rows(first_n, first_n + 1)
        if len(rows):
            return rows[0].copy(), int(steps[0]), float(times[0])
        # The span's first sample left the ring (a span longer than capacity): the oldest kept.
        rows, steps, times = self._rows(self._n - self.capacity, self._n - self.capacity + 1)
        return rows[0].copy(), int(steps[0]), float(times[0])

    def _bound_epochs(self) -> None:
        n = len(self.epochs)
        if n > self.detailed_epochs:
            k = n - self.detailed_epochs - 1
            if self.epochs[k].bucket_floor is not None:
                self.epochs[k] = self.epochs[k].compact()
        if n > self.max_epochs:
            # Merge the oldest half pairwise: history stays whole, memory stays bounded.
            half = (n - self.detailed_epochs) // 2 * 2
            merged = [merge(self.epochs[i], self.epochs[i + 1]) for i in range(0, half, 2)]
            self.epochs = merged + self.epochs[half:]

    def restore_epochs(self, epochs: Sequence[EpochSummary]) -> None:
        """Adopt epoch summaries from a checkpoint (resume keeps cross-epoch evidence)."""
        self.epochs = list(epochs) + self.epochs
        self._epoch_index = max(self._epoch_index, max((e.epoch for e in epochs), default=-1) + 1)
        # Only the most recent epochs keep their buckets, whatever the saving run kept.
        keep = len(self.epochs) - self.detailed_epochs
        for i in range(max(keep, 0)):
            if self.epochs[i].bucket_floor is not None:
                self.epochs[i] = self.epochs[i].compact()
        while len(self.epochs) > self.max_epochs:
            before = len(self.epochs)
            self._bound_epochs()
            if len(self.epochs) == before:
                break

    # ------------------------------------------------------------------ reading
    def latest(self) -> dict[str, float]:
        if self._n == 0:
            return {}
        row = self._pending_slow(self._data[(self._n - 1) % self.capacity:][:1], self._n - 1)[0]
        return {k: float(row[i]) for i, k in enumerate(self.keys)}

    def series(self, key: str, current_epoch_only: bool = False) -> tuple[IntArray, FloatArray]:
        """(steps, values) of ``key`` for every sample still in the ring (copies)."""
        start = self._epoch.first_n if current_epoch_only else self._n - self.capacity
        rows, steps, _ = self._rows(start, self._n)
        return steps.copy(), rows[:, self._col[key]].copy()

    def recent(self, n: int) -> tuple[FloatArray, IntArray, FloatArray]:
        """Copies of the last ``n`` samples still in the ring: (rows, steps, times)."""
        rows, steps, times = self._rows(self._n - max(int(n), 0), self._n)
        return rows.copy(), steps.copy(), times.copy()

    def times(self) -> FloatArray:
        _, _, times = self._rows(self._n - self.capacity, self._n)
        return times.copy()

    def current_epoch_buckets(self) -> dict[str, FloatArray]:
        """Buckets of the epoch in progress (without closing it)."""
        self._flush()
        b = self._epoch.builder
        return {"floor": b.floor[: b.nb].copy(), "peak": b.peak[: b.nb].copy()}

    def __len__(self) -> int:
        return min(self._n, self.capacity)

    def nbytes(self) -> int:
        """Bytes held by this timeline's arrays (what `memwatch`'s own memory is made of)."""
        total = self._data.nbytes + self._steps.nbytes + self._times.nbytes
        for b in (self._epoch.builder, self._segment.builder):
            total += b.floor.nbytes + b.peak.nbytes + b.last.nbytes + b.step.nbytes + \
                b.count.nbytes
        for e in self.epochs:
            for name in ("floor", "peak", "first", "last", "bucket_step", "bucket_count",
                         "bucket_floor", "bucket_peak", "bucket_last"):
                arr = getattr(e, name)
                if arr is not None:
                    total += arr.nbytes
        return total
