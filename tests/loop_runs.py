"""Loops that must run in an interpreter of their own (real DataLoader workers, a heap no other
test touched): ``LoopRuns(path)(mode, tmp_path)`` runs ``python path MODE OUT_JSON`` once
per mode, in a process forked from the worker's zygote (``tests/zygote.py``: an interpreter
that has only imported torch and memwatch; a new interpreter for the ``no_torch`` modes, which
must not find torch imported), and hands back the JSON it wrote (a mode's
findings, per epoch), cached for the session's other tests of that mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zygote


class LoopRuns:
    def __init__(self, script: Path, timeout_s: float = 240.0,
                 no_torch: tuple[str, ...] = ()) -> None:
        self.script = script
        self.timeout_s = timeout_s
        self.no_torch = no_torch
        self._runs: dict[str, Any] = {}

    def __call__(self, mode: str, tmp_path: Path) -> Any:
        if mode not in self._runs:
            out = tmp_path / f"{mode}.json"
            zygote.script(self.script, [mode, str(out)], cwd=tmp_path, timeout=self.timeout_s,
                          fork=mode not in self.no_torch)
            self._runs[mode] = json.loads(out.read_text())
        return self._runs[mode]
