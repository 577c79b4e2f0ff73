"""The limit that binds (issue 23): a run under an address-space limit (``ulimit -v``) is
forecast against that limit, not the machine's memory, and dies where the forecast said."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("ulimit_loop.py")


def test_a_run_under_ulimit_v_is_forecast_to_die_where_it_dies(tmp_path: Path) -> None:
    out = tmp_path / "found.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "600"], check=True, timeout=300,
                   capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    (died,) = [r["died_at"] for r in rows if "died_at" in r]
    first = next(r for r in rows if "steps_to_oom" in r)
    # The limit as it was set (ulimit takes KiB), and where RSS meets it.
    assert "the address-space limit (RLIMIT_AS " in first["message"], first["message"]
    assert "`ulimit -v " in first["message"] and "this memory meets it at about" in \
        first["message"]
    predicted, actual = first["steps_to_oom"], died - first["step"]
    assert abs(predicted - actual) <= 0.5 * actual, (first, died)
