"""What every framework adapter does the same way: option checks, session options, warnings.

The Lightning and transformers callbacks and the Accelerate hook differ in how they hear about
steps and epochs; how they validate what the user passed, build an evaluation session, and warn
about a finding is one piece of code here, so the three cannot drift apart.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.session import MemWatch

log = logging.getLogger("memwatch")

#: Layout of an adapter's checkpoint state: ``{"version": 1, "findings": [...], "warned":
#: [[stage, kind, metric], ...], "train": MemWatch.state_dict()}`` (plain data only).
ADAPTER_STATE_VERSION = 1

#: What ``graceful_stop=True`` asks of the watchdog when the user configured none: it decides
#: when to stop (OOM forecast within its horizon, or critical usage); the adapter turns that
#: decision into a checkpoint and a clean stop.
GRACEFUL_STOP_WATCHDOG: dict[str, Any] = {"on_critical": ("alert", "bundle", "stop"),
                                          "on_forecast": ("alert", "stop")}


def check_given(who: str, memwatch: Any, options: dict[str, Any]) -> None:
    """A MemWatch the user passes comes configured: it excludes MemWatch options."""
    if memwatch is not None and options:
        raise ConfigError(
            f"{who} got memwatch=... and MemWatch options {sorted(options)}; "
            "configure the MemWatch you pass instead."
        )
    if memwatch is not None and not isinstance(memwatch, MemWatch):
        raise ConfigError(
            f"memwatch={memwatch!r} is not a memwatch.MemWatch; pass one or leave it None."
        )


def check_log_every(value: Any, fix: str) -> None:
    """``log_every_n_steps`` must be a positive int; ``fix`` ends the message (", e.g. 50.")."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"log_every_n_steps={value!r} must be an int >= 1{fix}")


def build_memwatch(who: str, options: dict[str, Any]) -> MemWatch:
    """``MemWatch(**options)``, an unknown option reported as a ConfigError naming ``who``."""
    try:
        return MemWatch(**options)
    except TypeError as e:
        raise ConfigError(f"{who}: {e}; see memwatch.MemWatch for the options it accepts.") from e


def check_options(who: str, options: dict[str, Any]) -> None:
    """Validate MemWatch options at construction (a typo fails there, not mid-training)."""
    build_memwatch(who, {"device": "cpu", **options})


def session_options(given: MemWatch | None, options: dict[str, Any], device: Any,
                    out_dir: str, for_eval: bool) -> dict[str, Any]:
    """Options of a session the adapter creates: the user's options (or, for the evaluation
    timeline beside a MemWatch the user passed, that MemWatch's configuration), the adapter's
    device and output folder as defaults, and for evaluation no recorder, signals, watchdog or
    sinks (one process, one flight recorder: the training session owns them, and the user's
    sinks watch training)."""
    opts = dict(options)
    if given is not None:
        opts = {
            "device": getattr(given, "_device_spec", "auto"),
            "host": given.host,
            "workers": given.workers,
            "out_dir": given.out_dir,
            "interval_s": given.interval_s,
            "capacity": given.capacity,
            "buckets_per_epoch": given.buckets_per_epoch,
            "analyze": given.analyze,
            "census": given.census_mode,
            "tracemalloc": given.tracemalloc_frames or False,
        }
    opts.setdefault("device", device)
    opts.setdefault("out_dir", out_dir)
    if for_eval:
        opts.update(recorder=False, signals=False, watchdog=False)
        opts.pop("sinks", None)
    return opts


class FindingWarner:
    """A :class:`memwatch.MemWatchWarning` once per (stage, kind, metric), and once more when a
    later verdict names the holder the first could not (the census needs two epoch ends), since
    that is news."""

    def __init__(self) -> None:
        #: (stage, kind, metric) already warned about; checkpointable as a list of lists.
        self.warned: set[tuple[str, str, str]] = set()

    def warn(self, f: Finding, labels: str = "", stage: str = "train",
             stacklevel: int = 2) -> None:
        """Warn about ``f`` unless already warned; ``labels`` follow "memwatch" in the text
        (e.g. " [rank 1] [val loop]"); ``stacklevel`` is the caller's, as for warnings.warn."""
        key = (stage, f.kind, f.metric)
        named = (stage, f.kind, f.metric + "#culprit")
        if key in self.warned and (not f.culprit or named in self.warned):
            return
        self.warned.add(key)
        if f.culprit:
            self.warned.add(named)
        text = f"memwatch{labels}: {f.kind} in {f.metric}: {f.message}"
        if f.culprit and f.culprit not in text:
            text += f" Held by: {f.culprit}."
        if f.suggestions:
            text += " Try: " + "; ".join(f.suggestions)
        warnings.warn(text, MemWatchWarning, stacklevel=stacklevel + 1)


# ---------------------------------------------------------------------- checkpoints
def adapter_state(mw: MemWatch | None, findings: list[Finding],
                  warner: FindingWarner) -> dict[str, Any]:
    """An adapter's checkpoint state: its findings (training and evaluation), the warnings
    already given, and the training session's :meth:`MemWatch.state_dict` (plain data)."""
    from memwatch.runtime.resume import plain

    state: dict[str, Any] = {"version": ADAPTER_STATE_VERSION, "findings": [], "warned": []}
    try:
        state["findings"] = [plain(f.to_dict()) for f in findings]
        state["warned"] = [list(k) for k in sorted(warner.warned)]
    except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
        log.warning("memwatch: findings not saved with the checkpoint (%s: %s)",
                    type(e).__name__, e)
    if mw is not None:
        state["train"] = mw.state_dict()  # never raises
    return state


@dataclass
class RestoredState:
    """What :func:`read_adapter_state` found in a checkpoint."""

    findings: list[Finding] = field(default_factory=list)
    warned: set[tuple[str, str, str]] = field(default_factory=set)
    train: dict[str, Any] | None = None  # for MemWatch.load_state_dict


def read_adapter_state(state: Any) -> RestoredState | None:
    """Parse :func:`adapter_state`'s output; ``None`` (after a warning) when it is unusable."""
    version = state.get("version") if isinstance(state, dict) else None
    if version != ADAPTER_STATE_VERSION:
        log.warning("memwatch: checkpoint state version %r not understood; starting fresh",
                    version)
        return None
    try:
        out = RestoredState(
            findings=[Finding.from_dict(d) for d in state.get("findings") or []],
            warned={(str(a), str(b), str(c)) for a, b, c in state.get("warned") or []},
        )
        train = state.get("train")
        if isinstance(train, dict):
            train = dict(train)
            if "version" not in train:
                # Written by the Lightning callback of memwatch before MemWatch.state_dict():
                # the same layout, with the training findings kept at the top level only.
                from memwatch.runtime.resume import STATE_VERSION

                train["version"] = STATE_VERSION
                train.setdefault("findings", [
                    d for d in state.get("findings") or []
                    if (d.get("evidence") or {}).get("stage", "train") == "train"])
            out.train = train
        return out
    except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
        log.warning("memwatch: checkpoint state not usable (%s: %s); starting fresh",
                    type(e).__name__, e)
        return None
