"""Loops that must run in an interpreter of their own (real DataLoader workers, a heap no other
test touched): ``LoopRuns(path)(mode, tmp_path)`` runs ``python path MODE OUT_JSON`` once
per mode and hands back the JSON it wrote (a mode's findings, per epoch), cached for the
session's other tests of that mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


class LoopRuns:
    def __init__(self, script: Path, timeout_s: float = 240.0) -> None:
        self.script = script
        self.timeout_s = timeout_s
        self._runs: dict[str, Any] = {}

    def __call__(self, mode: str, tmp_path: Path) -> Any:
        if mode not in self._runs:
            out = tmp_path / f"{mode}.json"
            subprocess.run([sys.executable, str(self.script), mode, str(out)], check=True,
                           timeout=self.timeout_s, cwd=tmp_path)
            self._runs[mode] = json.loads(out.read_text())
        return self._runs[mode]
