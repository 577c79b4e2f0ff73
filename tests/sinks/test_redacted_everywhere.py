"""A token-shaped key of a leaking dict (``store['hf_...']``) is the culprit a real leak verdict
names; it must be redacted on every path out of the process: the black box, the JSONL log, the
W&B findings tables and summary (an offline run, read back from disk), the report of the live
run, and the bundle. The loop runs in its own interpreter (``redaction_loop.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb")

LOOP = Path(__file__).with_name("redaction_loop.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_token_shaped_key_is_redacted_on_every_path(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_CONSOLE": "off", "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, str(LOOP), str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "store['<redacted>']" in r.stdout  # the verdict named the holder
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    leaked = [str(p.relative_to(tmp_path)) for p in written if b"LEAKEDTAIL" in p.read_bytes()]
    assert leaked == []
    named = {str(p.relative_to(tmp_path)).split("/")[0] if "wandb" in str(p) else p.name
             for p in written if b"store['<redacted>']" in p.read_bytes()
             or b"store[\\u0027<redacted>\\u0027]" in p.read_bytes()
             or b"store[&#x27;&lt;redacted&gt;&#x27;]" in p.read_bytes()}
    for path in ("events.jsonl", "blackbox-copy.json", "report.html", "findings.json", "wandb"):
        assert path in named, (path, sorted(named))
