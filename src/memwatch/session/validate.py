"""How each option's value is checked: one function per kind of value, each raising
:class:`memwatch.ConfigError` that names the option and the fix, and returning the value as the
session keeps it (``1`` -> ``1.0`` for a number of seconds, a device spec lower-cased...).

:class:`memwatch.WatchConfig` names each option's check beside its field; nothing else reads
these.

Example::

    >>> from memwatch.session.validate import positive
    >>> positive("for example 60 (seconds)")("exchange_timeout_s", 60)
    60.0
    >>> positive("for example 60 (seconds)")("exchange_timeout_s", 0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memwatch.core.errors.ConfigError: exchange_timeout_s=0 must be a positive number; ...
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.culprits.census.allocations import DEFAULT_FRAMES, MAX_FRAMES
from memwatch.core.errors import ConfigError
from memwatch.core.safefs import modes
from memwatch.runtime.dispatch import SinkSet, validate_sinks

__all__ = ["DEVICE_CHOICES", "Check", "analyzer_config", "at_least", "capacity", "check_steps",
           "choice", "device", "even_buckets", "flag", "optional", "out_dir", "positive",
           "positive_int", "share", "sinks", "tracemalloc_frames"]

#: A check: ``(option name, value) -> the value kept``; raises ConfigError.
Check = Callable[[str, Any], Any]

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|mps)(?::(\d+))?$")
DEVICE_CHOICES = "None/'auto', 'cpu', 'cuda', 'cuda:N', 'mps', or a probe such as FakeDevice"
#: Bytes of the ring per row and metric column (float64), and the most metric columns a session
#: has (device, host, RSS parts, workers, cgroup): what ``capacity`` costs.
_ROW_BYTES = 8 * 64
_SPECIAL_DIRS = ("/proc", "/sys", "/dev")


def optional(check: Check) -> Check:
    """``check``, or ``None`` as it is."""
    return lambda name, value: None if value is None else check(name, value)


def flag(name: str, value: Any) -> bool:
    # ``recorder='off'`` is truthy: a string or a number must never turn a feature on.
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be True or False.")
    return value


def positive(fix: str) -> Check:
    """A positive finite number, kept as a float; ``fix`` ends the message."""
    def check(name: str, value: Any) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or (
            isinstance(value, float) and math.isinf(value)
        ):
            raise ConfigError(f"{name}={value!r} must be a positive number; {fix}.")
        return float(value)
    return check


def positive_int(fix: str) -> Check:
    """A positive int; ``fix`` ends the message."""
    def check(name: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive number (an int); {fix}.")
        return value
    return check


def at_least(low: int, why: str) -> Check:
    """An int of at least ``low``; ``why`` ends the message."""
    def check(name: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name}={value!r} must be an int >= {low} {why}")
        return value
    return check


def check_steps(name: str, value: Any) -> int | str | None:
    """``check_every_n_steps``: ``"auto"`` (sized to the run), ``None`` (off) or an int >= 16."""
    if value is None or value == "auto":
        return "auto" if value is not None else None
    steps: int = at_least(16, "(a check needs a few points to see a trend), 'auto' (checks "
                              "sized to the run) or None for checks at epoch ends and by time "
                              "only; e.g. 5000.")(name, value)
    return steps


def choice(*choices: str, why: str = "") -> Check:
    """One of ``choices``."""
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{name}={value!r}: use one of {', '.join(map(repr, choices))}"
                              + (f" ({why})" if why else "") + ".")
        return value
    return check


def device(name: str, value: Any) -> Any:
    """A device spec (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``; a
    ``torch.device`` becomes one) or a probe object."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        m = _DEVICE_RE.match(value.strip().lower())
        if not m or (m.group(2) is not None and m.group(1) != "cuda"):
            raise ConfigError(f"{name}={value!r} is not understood; use {DEVICE_CHOICES}.")
        return value.strip().lower()
    if type(value).__name__ == "device" and type(value).__module__.startswith("torch"):
        return device(name, str(value))
    if hasattr(value, "read_fast") and hasattr(value, "fast_keys"):
        return value
    raise ConfigError(f"{name}={value!r} is not understood; use {DEVICE_CHOICES}.")


def capacity(name: str, value: Any) -> int:
    """Rows kept in the ring: at least 16, and a ring that takes at most a quarter of the
    machine's memory (``capacity=10**10`` would fail at start with MemoryError)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 16:
        raise ConfigError(f"{name}={value!r} must be an int >= 16 (rows kept in the ring), "
                          "e.g. 32768.")
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - unknown machine: a fixed bound
        total = 1 << 36
    most = max(16, total // 4 // _ROW_BYTES)
    if value > most:
        raise ConfigError(f"{name}={value} rows would take up to {value * _ROW_BYTES >> 20} "
                          f"MiB; this machine allows at most {most} (a quarter of its memory), "
                          "and the default 32768 keeps every step of long epochs in summaries "
                          "anyway.")
    return value


def even_buckets(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 4 <= value <= 65536 or \
            value % 2:
        raise ConfigError(f"{name}={value!r} must be an even int from 4 to 65536, e.g. 256.")
    return value


def out_dir(name: str, value: Any) -> str:
    """A path, not an existing file, not under /proc, /sys or /dev (the evidence would be lost
    at the crash). Ownership and permissions are checked when the session starts."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name}={value!r} must be a directory path such as 'memwatch'.")
    out = os.fspath(value)
    if not isinstance(out, str) or not out:
        raise ConfigError(f"{name}='' is empty; pass a directory path such as 'memwatch'.")
    full = os.path.realpath(os.path.abspath(out))
    special = next((d for d in _SPECIAL_DIRS if full == d or full.startswith(d + os.sep)), None)
    if special is not None:
        raise ConfigError(f"{name}={out!r} is under {special}, a kernel file system where "
                          "bundles cannot be kept; pass a directory on disk such as "
                          "'./memwatch'.")
    if os.path.exists(full) and not os.path.isdir(full):
        raise ConfigError(f"{name}={out!r} exists and is not a directory; pass a directory "
                          "path (it is created when missing).")
    return out


def tracemalloc_frames(value: Any) -> int:
    """``tracemalloc=`` as a frame count: 0 (off), the default for True, or the int given."""
    if value is False:
        return 0
    if value is True:
        return DEFAULT_FRAMES
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_FRAMES:
        return value
    raise ConfigError(
        f"tracemalloc={value!r} is not understood; use False (off), True (trace Python "
        f"allocations with {DEFAULT_FRAMES} frames each) or the number of frames to keep, an "
        f"int from 1 to {MAX_FRAMES} (more frames cost more per allocation)."
    )


def tracing(name: str, value: Any) -> bool | int:
    tracemalloc_frames(value)
    return value  # type: ignore[no-any-return]


def analyzer_config(name: str, value: Any) -> AnalyzerConfig | None:
    if value is not None and not isinstance(value, AnalyzerConfig):
        raise ConfigError(f"{name}={value!r} must be a memwatch.AnalyzerConfig (e.g. "
                          "AnalyzerConfig(near_oom_margin=0.05)) or None for the defaults.")
    return value


def share(name: str, value: Any) -> str:
    modes(value)  # ConfigError naming share= and its values
    return value  # type: ignore[no-any-return]


def sinks(name: str, value: Any) -> tuple[Any, ...] | SinkSet:
    """A list of sinks as a tuple (each checked); a :class:`SinkSet` is shared as it is."""
    return value if isinstance(value, SinkSet) else tuple(validate_sinks(value))
