"""What a checkpoint keeps of a :class:`memwatch.MemWatch`, as plain data.

A leak verdict needs evidence from more than one epoch (the floors of earlier epochs). A run that
is resumed from a checkpoint starts a new session in a new process; without the epochs from
before the restart, a leak that began before it is only confirmed two epochs later.
:meth:`MemWatch.state_dict` and :meth:`MemWatch.load_state_dict` carry them across.

The state is plain data only (dicts, lists, str, int, float, bool, None; no NaN: a missing value
is ``None``), so it can be written with ``json.dump(..., allow_nan=False)`` and read back with
``torch.load(weights_only=True)`` when a framework saves it with ``torch.save``.

Layout (``version`` 1)::

    {"version": 1, "step_count": int, "epoch": int,
     "epochs": [summary, ...],        # the timeline's epoch summaries, oldest first
     "findings": [Finding.to_dict(), ...]}

Each summary keeps its metric names (``keys``), so a run with other metrics (a GPU run resumed
on a CPU machine, a probe that failed) remaps the columns by name: a metric the new run lacks is
dropped, a new one is ``NaN`` in the restored epochs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memwatch.timeline import EpochSummary

#: The layout written by :func:`session_state`; another version is not loaded (fresh start).
STATE_VERSION = 1

_SUMMARY_ARRAYS = ("floor", "peak", "first", "last")
_BUCKET_ARRAYS = ("bucket_floor", "bucket_peak", "bucket_last")
_BUCKET_INTS = ("bucket_step", "bucket_count")


def plain(value: Any) -> Any:
    """``value`` as plain data: numpy scalars and arrays as Python numbers and lists, tuples and
    sets as lists, NaN and infinities as ``None``, anything else unknown as its ``str``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return str(value)


def _floats(arr: Any) -> Any:
    if arr is None:
        return None
    a = np.asarray(arr, dtype=np.float64).astype(object)
    a[~np.isfinite(np.asarray(arr, dtype=np.float64))] = None
    return a.tolist()


def summary_to_state(e: EpochSummary) -> dict[str, Any]:
    """One epoch summary as plain data (NaN as ``None``)."""
    d: dict[str, Any] = {
        "epoch": int(e.epoch), "start_step": int(e.start_step), "end_step": int(e.end_step),
        "n_steps": int(e.n_steps), "t_start": float(e.t_start), "t_end": float(e.t_end),
        "keys": list(e.keys), "slow_keys": list(e.slow_keys), "slow_reads": int(e.slow_reads),
    }
    for name in _SUMMARY_ARRAYS + _BUCKET_ARRAYS:
        d[name] = _floats(getattr(e, name))
    for name in _BUCKET_INTS:
        arr = getattr(e, name)
        d[name] = None if arr is None else [int(x) for x in arr]
    return d


def summary_from_state(d: Mapping[str, Any], keys: Sequence[str]) -> EpochSummary:
    """Rebuild a summary with this run's metric columns ``keys`` (remapped by name; NaN where a
    metric is new). Reads ``None`` and ``NaN`` alike as a missing value. Raises on a malformed
    entry (the caller decides what a bad state means)."""
    keys = tuple(keys)
    saved = [str(k) for k in d["keys"]]
    cols = [saved.index(k) if k in saved else -1 for k in keys]

    def remap(values: Any, dims: int) -> Any:
        if values is None:
            return None
        arr = np.asarray(values, dtype=np.float64)
        arr = arr.reshape((-1, len(saved)) if dims == 2 else (len(saved),))
        out = np.full((arr.shape[0], len(keys)) if dims == 2 else (len(keys),), np.nan)
        for j, c in enumerate(cols):
            if c >= 0:
                out[..., j] = arr[..., c]
        return out

    def ints(values: Any) -> Any:
        return None if values is None else np.asarray(values, dtype=np.int64).reshape(-1)

    e = EpochSummary(
        epoch=int(d["epoch"]), start_step=int(d["start_step"]), end_step=int(d["end_step"]),
        n_steps=int(d["n_steps"]), t_start=float(d["t_start"]), t_end=float(d["t_end"]),
        keys=keys,
        floor=remap(d["floor"], 1), peak=remap(d["peak"], 1),
        first=remap(d["first"], 1), last=remap(d["last"], 1),
        bucket_step=ints(d.get("bucket_step")), bucket_count=ints(d.get("bucket_count")),
        bucket_floor=remap(d.get("bucket_floor"), 2), bucket_peak=remap(d.get("bucket_peak"), 2),
        bucket_last=remap(d.get("bucket_last"), 2),
        slow_keys=tuple(k for k in keys if k in set(d.get("slow_keys") or ())),
        slow_reads=int(d.get("slow_reads") or 0),
    )
    buckets = [getattr(e, n) for n in _BUCKET_INTS + _BUCKET_ARRAYS]
    if any(b is None for b in buckets):
        e = e.compact()  # all or none: a partial set of buckets is not usable
    elif len({len(b) for b in buckets}) != 1:
        raise ValueError(f"epoch {e.epoch}: bucket arrays of different lengths")
    return e


def epochs_from_state(entries: Sequence[Mapping[str, Any]],
                      keys: Sequence[str]) -> list[EpochSummary]:
    """The saved epochs, checked: increasing epoch numbers, steps that do not go back."""
    epochs = [summary_from_state(d, keys) for d in entries]
    for a, b in zip(epochs, epochs[1:], strict=False):
        if b.epoch <= a.epoch or b.start_step <= a.end_step:
            raise ValueError(f"epochs out of order: {a.epoch} (steps {a.start_step}-"
                             f"{a.end_step}) before {b.epoch} (steps {b.start_step}-"
                             f"{b.end_step})")
    return epochs
