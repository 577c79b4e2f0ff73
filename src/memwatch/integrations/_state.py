"""An adapter's state in a framework checkpoint: its layout, and reading it back (old layouts
included). Writing it is :meth:`memwatch.integrations._driver.Driver.state_dict`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from memwatch.core.findings import Finding
from memwatch.runtime.resume import STATE_VERSION

__all__ = ["ADAPTER_STATE_VERSION", "STATE_FILE", "RestoredState", "read_adapter_state"]

log = logging.getLogger("memwatch")

#: Layout of an adapter's checkpoint state: ``{"version": 1, "rank": r, "findings": [...],
#: "warned": [[stage, kind, metric], ...], "train": MemWatch.state_dict()}`` (plain data only).
ADAPTER_STATE_VERSION = 1
#: The file the adapters write into a framework checkpoint folder (``-rank<N>`` for other ranks).
STATE_FILE = "memwatch_state.json"


@dataclasses.dataclass
class RestoredState:
    """What :func:`read_adapter_state` found in a checkpoint."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    warned: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    train: dict[str, Any] | None = None  # for MemWatch.load_state_dict
    rank: int | None = None


def read_adapter_state(state: Any) -> RestoredState | None:
    """Parse an adapter's checkpoint state; ``None`` (after a warning) when it is unusable."""
    version = state.get("version") if isinstance(state, dict) else None
    if version != ADAPTER_STATE_VERSION:
        log.warning("memwatch: checkpoint state version %r not understood; starting fresh",
                    version)
        return None
    try:
        out = RestoredState(
            findings=[Finding.from_dict(d) for d in state.get("findings") or []],
            warned={(str(a), str(b), str(c)) for a, b, c in state.get("warned") or []},
            rank=state.get("rank"))
        train = state.get("train")
        if isinstance(train, dict):
            train = dict(train)
            if "version" not in train:
                # Written by the Lightning callback of memwatch before MemWatch.state_dict():
                # the same layout, with the training findings kept at the top level only.
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
