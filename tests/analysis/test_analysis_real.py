"""Real CPU training loops with planted leaks: verdict, culprit and suggestion end to end.

Each runs in a process of its own (forked from the worker's zygote, ``tests/zygote.py``): host
RSS is the signal, and other tests would pollute it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import zygote

HERE = Path(__file__).parent


_cache: dict[str, list[list[dict[str, object]]]] = {}


def run_mode(mode: str, tmp_path: Path) -> list[list[dict[str, object]]]:
    if mode in _cache:  # each loop costs seconds: run it once per session
        return _cache[mode]
    out = tmp_path / f"{mode}.json"
    env = dict(os.environ, PYTHONWARNINGS="error")
    zygote.script(HERE / "real_loop_scenarios.py", [mode, str(out)], cwd=tmp_path, env=env,
                  timeout=120)
    _cache[mode] = json.loads(out.read_text())
    return _cache[mode]


CASES = {
    # mode: (substring of the culprit, substring of the first suggestion)
    "cache": ("state.cache", "cache without eviction"),
    "eval": ("val_outputs", "bound it"),
    "exc": ("errors", "traceback"),
    "hook": ("_forward_hooks", "register it once"),
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_planted_leak_found_with_culprit(mode: str, tmp_path: Path) -> None:
    epochs = run_mode(mode, tmp_path)
    leaks = [f for f in epochs[1] + epochs[2] if f["kind"] == "leak"]
    assert leaks, epochs
    first = leaks[0]
    assert first["metric"] == "host.rss"
    culprit, suggestion = CASES[mode]
    assert culprit in str(first["culprit"]), first["culprit"]
    assert suggestion in " ".join(first["suggestions"]), first["suggestions"]  # type: ignore[arg-type]
    ev = first["evidence"]
    assert isinstance(ev, dict) and ev["census_ms"] > 0 and ev["objects_scanned"] > 0


def test_eval_outputs_kept_with_graph_say_so(tmp_path: Path) -> None:
    epochs = run_mode("eval", tmp_path)
    leak = [f for f in epochs[1] + epochs[2] if f["kind"] == "leak"][0]
    assert "grad_fn=AddmmBackward0" in str(leak["culprit"])
    assert "autograd graph" in str(leak["message"])
    assert any("no_grad" in s for s in leak["suggestions"])  # type: ignore[union-attr]


def test_clean_loop_is_quiet(tmp_path: Path) -> None:
    epochs = run_mode("clean", tmp_path)
    assert [f for fs in epochs for f in fs if f["severity"] != "info"] == []
