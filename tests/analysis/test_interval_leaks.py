"""Checks inside one long epoch (issue 23): a 16 KB-a-step leak, 8 MB between checks of 500
steps, is confirmed and named within three intervals; its clean twin is quiet."""

from __future__ import annotations

from pathlib import Path

from loop_runs import LoopRuns

run_loop = LoopRuns(Path(__file__).with_name("interval_loops.py"))


def test_a_16_kb_a_step_leak_is_confirmed_within_three_intervals(tmp_path: Path) -> None:
    found = run_loop("slow16k", tmp_path)
    leaks = [f for f in found if f["kind"] == "leak"]
    assert leaks, found
    assert leaks[0]["step"] <= 1500, leaks[0]  # the third check, at the latest
    # ... and named by then: the first verdict may come a check before its holder (the C
    # allocator's in-use bytes confirm it before a second census can name it).
    named = [f for f in leaks if f["culprit"]]
    assert named, leaks
    first = named[0]
    assert first["step"] <= 1500, first
    assert first["culprit"].startswith("interval_loops.kept (list, "), first["culprit"]
    # the rate within 25% of what is planted (a 16 KiB bytearray and its object header), the
    # corpus's target for forecasts: the heap's free space absorbs part of it at first
    planted = 16 * 1024 + 57
    assert 0.75 * planted <= first["bytes_per_step"] <= 1.25 * planted, first["bytes_per_step"]


def test_its_clean_twin_is_quiet(tmp_path: Path) -> None:
    found = run_loop("clean", tmp_path)
    assert [f for f in found if f["kind"] in ("leak", "allocator_retention")] == [], found
