"""An adapter's state in a framework checkpoint: its layout, reading it back (old layouts
included), and the file it is kept in beside a framework's checkpoint. Making it is
:meth:`memwatch.integrations._driver.Driver.state_dict`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from memwatch.core.findings import Finding
from memwatch.runtime.resume import STATE_VERSION

__all__ = ["ADAPTER_STATE_VERSION", "STATE_FILE", "RestoredState", "read_adapter_state",
           "read_state_file", "state_path", "write_state_file"]

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


def state_path(folder: str | os.PathLike[str], rank: int) -> str:
    """The state file of ``rank`` in a checkpoint folder (:data:`STATE_FILE`, ``-rank<N>`` for
    ranks other than 0)."""
    name = STATE_FILE if rank == 0 else STATE_FILE.replace(".json", f"-rank{rank}.json")
    return os.path.join(os.fspath(folder), name)


def write_state_file(folder: str | os.PathLike[str], rank: int, state: dict[str, Any]) -> None:
    """Write ``state`` as ``rank``'s state file in ``folder``, atomically."""
    path = state_path(folder, rank)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, allow_nan=False)
    os.replace(tmp, path)


def read_state_file(folder: str | os.PathLike[str], rank: int) -> Any:
    """``rank``'s state from its file in ``folder``; None when the folder has none."""
    path = state_path(folder, rank)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
