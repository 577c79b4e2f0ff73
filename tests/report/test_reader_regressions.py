"""The failure classes that fuzzing found in the export reader and the report helpers (1-11:
issue 44; 12-13: the CLI fuzzer and a sweep of every census.json and findings.json field after
issue 41 added the killer), one regression test each, on real artefacts
(``tests/fuzz_artefacts.py``), and ``memwatch report`` on a log beside a FIFO or a ``/dev/zero``
link: one line, exit code 2, at once.

Before: a FIFO named ``events.jsonl.<digit>`` hung ``memwatch report``; a link to ``/dev/zero``
read until ``MemoryError``; a sparse 8 GiB file hung; ``"².isdigit()"`` then ``int()`` raised; a
list ``rank`` raised ``TypeError``; ``timeline.json`` 1,000 deep raised ``RecursionError``; a
401-digit integer raised ``OverflowError`` in ``report/jobs.py``, ``report/summary.py`` and
``report/data.py``; a lone surrogate raised ``UnicodeEncodeError`` writing the HTML; a snapshot
block whose size is a dict raised ``TypeError`` in ``segments_summary``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fuzz_artefacts import Artefacts, make_artefacts
from hostile_bundles import patch_json, set_file
from memwatch.bundle import find_bundles, open_bundle
from memwatch.bundle.documents import segments_summary
from memwatch.cli import CAUGHT_MALFORMED, main
from memwatch.core.errors import BundleError, MemwatchError
from memwatch.report.exports import from_export
from memwatch.report.html import render, render_bundle_html, write_html
from memwatch.report.jobs import compare, group_jobs, render_comparison
from memwatch.report.summary import summarize

BIG = "9" * 401


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Artefacts:
    return make_artefacts(tmp_path_factory.mktemp("real"))


@pytest.fixture
def log(real: Artefacts, tmp_path: Path) -> Path:
    """A copy of the real rotated log (events.jsonl and events.jsonl.1 ...)."""
    for f in [real.log, *real.rotated()]:
        shutil.copyfile(f, tmp_path / f.name)
    return tmp_path / real.log.name


@pytest.fixture
def bundle(real: Artefacts, tmp_path: Path) -> Path:
    b = tmp_path / "oom" / real.bundle.name
    shutil.copytree(real.bundle, b)
    return b


def _part_with_samples(log: Path) -> Path:
    """The newest file of the rotated log that holds sample lines (the newest one alone may
    hold only the run's last events: where a rotation falls depends on the events' sizes)."""
    parts = [log, *sorted(log.parent.glob(log.name + ".*"),
                          key=lambda p: int(p.name.rsplit(".", 1)[1]))]
    return next(p for p in parts if sum('"host.rss":' in ln
                                        for ln in p.read_text().splitlines()[1:3]) >= 1)


def _refused_at_once(path: Path, what: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(MemwatchError, match=what):
        from_export(path)
    assert time.monotonic() - t0 < 5


# --------------------------------------------------------------------------- the eleven
@pytest.mark.timeout(30)
def test_1_a_fifo_named_like_a_rotated_file_is_refused_not_waited_on(log: Path) -> None:
    os.mkfifo(log.parent / (log.name + ".7"))
    _refused_at_once(log, r"events\.jsonl\.7 is a FIFO \(refused")


@pytest.mark.timeout(30)
def test_2_a_rotated_file_linked_to_dev_zero_is_refused_not_read(log: Path) -> None:
    (log.parent / (log.name + ".9")).symlink_to("/dev/zero")
    _refused_at_once(log, r"events\.jsonl\.9 is a symlink \(refused")


@pytest.mark.timeout(60)
def test_3_a_sparse_8_gib_rotated_file_is_read_from_its_end_in_bounded_time(log: Path) -> None:
    with open(log.parent / (log.name + ".8"), "wb") as f:
        f.truncate(8 << 30)
    t0 = time.monotonic()
    d = from_export(log)
    assert time.monotonic() - t0 < 20
    # The newest files were read (the budget goes newest first); the zeros were never a line.
    assert d.steps and "host.rss" in d.values
    assert any("older file(s) of the log left out" in n or "only its last" in n
               for n in d.notes), d.notes


def test_4_a_rotated_suffix_of_unicode_digits_is_not_a_rotated_file(log: Path) -> None:
    (log.parent / (log.name + ".\u00b2")).write_text('{"event": "sample", "step": 1}\n')
    (log.parent / (log.name + ".\u0663")).write_text("not read\n")  # ARABIC-INDIC DIGIT THREE
    d = from_export(log)
    assert d.steps
    assert not any("\u00b2" in n or "\u0663" in n for n in d.notes)


def test_5_a_rank_that_is_a_list_is_ignored(log: Path) -> None:
    part = _part_with_samples(log)
    lines = part.read_text().splitlines()
    doc = json.loads(lines[1])
    lines[1] = json.dumps({**doc, "rank": [0, 1]})
    lines[2] = json.dumps({**json.loads(lines[2]), "rank": {"a": 1}})
    part.write_text("\n".join(lines) + "\n")
    d = from_export(log)
    assert d.steps and not any("mixes ranks" in n for n in d.notes)


def test_6_a_timeline_json_nested_1000_deep_is_refused(real: Artefacts, tmp_path: Path) -> None:
    doc = json.loads(real.json.read_text())
    doc["epochs"] = "DEEP"
    p = tmp_path / "timeline.json"
    p.write_text(json.dumps(doc).replace('"DEEP"', "[" * 1000 + "]" * 1000))
    with pytest.raises(MemwatchError, match="nested deeper than 64 levels"):
        from_export(p)
    p.write_text("[" * 1000 + "]" * 1000)
    with pytest.raises(MemwatchError, match="nested deeper than 64 levels"):
        from_export(p)


def test_7_a_401_digit_captured_at_unix_is_refused_not_overflowed(bundle: Path) -> None:
    from hostile_bundles import edit_manifest

    edit_manifest(bundle, lambda m: m.update(world_size=2, job={"id": "j-44", "attempt": 0}))
    mem = (bundle / "memory.json").read_text()
    doc = json.loads(mem)
    doc["captured_at_unix"] = 0  # placeholder replaced by the 401 digits as text
    set_file(bundle, "memory.json", json.dumps(doc).replace('"captured_at_unix": 0',
                                                            f'"captured_at_unix": {BIG}'))
    jobs, _ = group_jobs(find_bundles(bundle.parent))  # raised OverflowError
    assert len(jobs) == 1
    assert jobs[0].bundles[0].time == open_bundle(bundle).manifest["created_unix"]  # fallback
    with pytest.raises(BundleError, match=r"memory\.json: an integer of 401 digits"):
        compare(jobs[0])  # the documented refusal (exit 2 in the CLI), not an OverflowError
    # A time beyond the year 5138 is refused too (datetime would raise OverflowError).
    patch_json(bundle, "memory.json", lambda d: d.update(captured_at_unix=1e300))
    jobs, _ = group_jobs(find_bundles(bundle.parent))
    assert jobs[0].bundles[0].time == open_bundle(bundle).manifest["created_unix"]
    with pytest.raises(BundleError, match=r"field 'captured_at_unix' is 1e\+300, outside"):
        render_comparison(compare(jobs[0]))


def test_8_a_401_digit_number_in_exception_json_is_refused_not_overflowed(
        bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (bundle / "exception.json").read_text()
    doc = json.loads(text)
    doc["numbers"]["in_use_by_process"] = 0
    doc["numbers"]["total_capacity"] = 1 << 30
    set_file(bundle, "exception.json", json.dumps(doc).replace(
        '"in_use_by_process": 0', f'"in_use_by_process": {BIG}'))
    with pytest.raises(BundleError, match=r"exception\.json: an integer of 401 digits"):
        summarize(open_bundle(bundle))
    before = sum(CAUGHT_MALFORMED.values())
    assert main(["inspect", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "integer of 401 digits" in err and "malformed input" not in err
    assert sum(CAUGHT_MALFORMED.values()) == before


def test_9_a_401_digit_metric_value_in_a_log_skips_that_line(log: Path) -> None:
    part = _part_with_samples(log)
    lines = part.read_text().splitlines()
    n_before = len(from_export(log).steps)
    i = next(i for i, ln in enumerate(lines) if '"host.rss":' in ln)
    lines[i] = lines[i].replace('"host.rss":', f'"host.rss":{BIG},"x":', 1)
    part.write_text("\n".join(lines) + "\n")
    d = from_export(log)
    assert len(d.steps) == n_before - 1
    assert any("integer of 401 digits" in n for n in d.notes), d.notes
    # The same figure in a CSV cell is no number either (a float beyond the double range).
    csv = log.parent / "x.csv"
    csv.write_text(f"step,host.rss,memwatch/host.uss_gib\n1,{BIG},1e300\n2,5,1\n")
    d = from_export(csv)  # step 1 has no readable value: no point of the charts
    assert d.steps == [2] and d.values == {"host.rss": [5.0], "host.uss": [float(1 << 30)]}


def test_10_a_lone_surrogate_in_environment_json_is_replaced_in_the_html(
        bundle: Path, tmp_path: Path) -> None:
    patch_json(bundle, "environment.json", lambda d: d.update(device="gpu \udcff\ud800 x"))
    html = render_bundle_html(open_bundle(bundle), with_charts=False)
    out = write_html(html, tmp_path / "r.html")
    assert "gpu ?? x" in out.read_text(encoding="utf-8")
    # A report of a file whose name is not UTF-8 is written too ("?" for what cannot be).
    odd = tmp_path / os.fsdecode(b"events-\xff.jsonl")
    odd.write_text('{"event": "sample", "step": 1, "metrics": {"host.rss": 1}}\n')
    text = write_html(render(from_export(odd), with_charts=False), tmp_path / "o.html")
    assert "events-?.jsonl" in text.read_text(encoding="utf-8")


def test_11_a_snapshot_block_whose_size_is_a_dict_counts_as_zero(bundle: Path) -> None:
    snap = {"segments": [{"total_size": {"a": 1}, "allocated_size": 512, "blocks": [
        {"size": {"x": 1}, "state": "active_allocated"}, {"size": 10**400, "state": "inactive"},
        {"size": [1], "state": "active_allocated"}, {"size": 256, "state": "inactive"}]},
        {"total_size": 1 << 20, "blocks": {"not": "a list"}}]}
    s = segments_summary(snap)
    assert s is not None
    assert s["reserved_bytes"] == 1 << 20 and s["allocated_bytes"] == 512
    assert s["largest_free_block_bytes"] == 256 and s["blocks"] == 4
    set_file(bundle, "snapshot.pickle", pickle.dumps(snap, protocol=4))
    assert segments_summary(open_bundle(bundle).snapshot()) == s


@pytest.mark.parametrize("held", [True, -1, 1e308, {"a": [{"b": 1}]}])
def test_12_census_fields_of_the_wrong_type_are_read_as_absent(
        bundle: Path, tmp_path: Path, held: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """census.json's ``killer.held`` that is no list raised ``TypeError`` (subscripted), and a
    census group whose ``count`` is null raised it formatting the terminal's table (the CLI
    fuzzer's case 356, 2026-11-28)."""
    def plant(d: dict[str, Any]) -> None:
        d["killer"] = {"note": "grew", "held": held}
        d["groups"] = [{"bytes": 4096, "count": None, "dtype": "float32", "shape": [32, 32],
                        "device": "cpu"}]

    patch_json(bundle, "census.json", plant)
    before = sum(CAUGHT_MALFORMED.values())
    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "grew" in out and "xNone" in out
    assert main(["report", str(bundle), "-o", str(tmp_path / "r.html")]) == 0
    assert sum(CAUGHT_MALFORMED.values()) == before  # no backstop: each field read as it is


def test_13_a_rate_near_the_float_limit_charts_as_a_gap_not_an_error(
        bundle: Path, tmp_path: Path) -> None:
    """findings.json's ``bytes_per_step`` of 1e308: a forecast computed from it overflowed to
    infinity, which JSON cannot hold, and writing the HTML raised ``ValueError``."""
    def plant(d: list[dict[str, Any]]) -> None:
        for f in d:
            f["bytes_per_step"] = 1e308

    patch_json(bundle, "findings.json", plant)
    before = sum(CAUGHT_MALFORMED.values())
    assert main(["report", str(bundle), "-o", str(tmp_path / "r.html")]) == 0
    assert sum(CAUGHT_MALFORMED.values()) == before
    assert "Infinity" not in (tmp_path / "r.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the command line
def _report(log: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memwatch", "report", str(log), "-o",
                           str(tmp_path / "r.html")], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("plant", ["fifo", "dev-zero link"])
def test_report_on_a_log_beside_a_fifo_or_dev_zero_refuses_in_one_line_at_once(
        plant: str, log: Path, tmp_path: Path) -> None:
    beside = log.parent / (log.name + ".4")
    if plant == "fifo":
        os.mkfifo(beside)
    else:
        beside.symlink_to("/dev/zero")
    t0 = time.monotonic()
    proc = _report(log, tmp_path)
    took = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("memwatch report: error:") and "events.jsonl.4" in lines[0]
    assert "malformed input" not in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.html").exists()
    assert took < 20, took  # an interpreter start; the refusal itself is a stat


# --------------------------------------------------------------------------- found and bounded
def test_inspect_of_a_record_whose_sample_step_is_null(real: Artefacts, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the property tests: the sample table formatted a null step with ``:>8``."""
    d = tmp_path / "out" / "blackbox"
    d.mkdir(parents=True)
    doc = json.loads(real.record.read_text())
    assert doc["samples"]
    doc["samples"][-1]["step"] = None
    (d / real.record.name).write_text(json.dumps(doc))
    assert main(["inspect", str(d / real.record.name)]) == 0
    assert "None" in capsys.readouterr().out


def test_an_export_charts_a_bounded_number_of_metrics_and_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memwatch.report.exports as exports

    monkeypatch.setattr(exports, "MAX_STEPS", 50)
    p = tmp_path / "wide.jsonl"
    with open(p, "w") as f:
        for step in range(100):
            f.write(json.dumps({"step": step, **{f"host.m{i}": i for i in range(300)}}) + "\n")
    d = from_export(p)
    assert len(d.values) == 64 and d.steps == list(range(50))
    assert any("More than 64 metrics" in n for n in d.notes)
    assert any("More than 50 steps" in n for n in d.notes)
    # Columnar JSON: the work follows the values, not steps x columns.
    cols = {"step": list(range(10**6)), **{f"host.c{i}": [1.0] for i in range(1000)}}
    j = tmp_path / "wide.json"
    j.write_text(json.dumps({"samples": cols}))
    t0 = time.monotonic()
    d = from_export(j)
    assert d.steps == [0] and len(d.values) == 64 and time.monotonic() - t0 < 10


def test_a_timeline_header_of_thousands_of_keys(bundle: Path) -> None:
    lines = (bundle / "timeline.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["keys"] = [f"host.k{i}" for i in range(5000)]
    set_file(bundle, "timeline.jsonl", "\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(BundleError, match="holds 5000 items, over 4096"):
        list(open_bundle(bundle).timeline())
    head["keys"] = [*head["keys"][:100]]
    set_file(bundle, "timeline.jsonl", "\n".join([json.dumps(head), *lines[1:]]) + "\n")
    from memwatch.report.data import from_bundle

    d = from_bundle(open_bundle(bundle))
    assert len(d.values) == 64 and any("only the first 64" in n for n in d.notes)


def test_nan_and_infinity_in_a_log_are_no_reading(log: Path) -> None:
    """Python's json writes NaN and Infinity (memwatch writes null): they read as no value."""
    with open(log, "a") as f:
        f.write('{"event": "sample", "step": 100000, "metrics": {"host.rss": NaN, '
                '"host.uss": Infinity, "device.allocated": 1e999, "host.pss": 7}}\n')
    d = from_export(log)
    assert d.steps[-1] == 100000
    assert d.values["host.rss"][-1] is None and d.values["host.uss"][-1] is None
    assert d.values["device.allocated"][-1] is None and d.values["host.pss"][-1] == 7.0


def test_a_snapshot_whose_frame_length_is_2_to_the_64_is_refused() -> None:
    """Found by benchmarks/bench_fuzz_readers.py: the unpickler raised OverflowError."""
    from memwatch.core import safepickle
    from memwatch.core.errors import UnsafePickleError

    data = b"\x80\x04\x95" + (2**64 - 1).to_bytes(8, "little") + b"}."
    with pytest.raises(UnsafePickleError, match="truncated or corrupted"):
        safepickle.loads(data)
