"""The HTML report's content from each source (bundle, live run, exports) and its robustness.

What the page looks like in a browser is tests/test_report_browser.py; here the figures and tables
are checked in the document itself.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memwatch
import report_builders as rb
from memwatch.bundle import open_bundle
from memwatch.bundle.export import to_csv, to_json
from memwatch.cli import main
from memwatch.report.allocator import history_view, segments_view
from memwatch.report.data import ReportData, from_bundle, from_run
from memwatch.report.exports import from_export
from memwatch.report.html import render, render_bundle_html, render_export, render_run
from memwatch.report.trends import fit_trend
from memwatch.sinks import JsonlSink

MIB = rb.MIB


def figures(html: str) -> list[dict[str, Any]]:
    """The page's chart figures, with what they share (``{"ref": i}``) put back in place."""
    m = re.search(r"<script type='application/json' id='mw-figures'>(.*?)</script>", html, re.S)
    assert m, "no figures in the page"
    doc = json.loads(m.group(1))

    def deref(v: Any) -> Any:
        return doc["refs"][v["ref"]] if isinstance(v, dict) and "ref" in v else v

    for f in doc["figs"]:
        for t in f["data"]:
            t["x"] = deref(t.get("x"))
        for key in ("shapes", "annotations"):
            f["layout"][key] = deref(f["layout"].get(key))
    return doc["figs"]  # type: ignore[no-any-return]


def fig_titles(html: str) -> list[str]:
    return [f["layout"]["title"]["text"] for f in figures(html)]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rb.oom_bundle(tmp_path_factory.mktemp("report-bundle"))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> memwatch.MemWatch:
    return rb.live_run_with_workers(tmp_path_factory.mktemp("report-live"))


# ---------------------------------------------------------------- bundle
def test_bundle_report_sections(bundle: Path, tmp_path: Path) -> None:
    html = render_bundle_html(open_bundle(bundle))
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "plotly.js v" in html  # inlined, not fetched
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    titles = fig_titles(html)
    assert titles[:2] == ["device.allocated", "device.reserved"]
    assert "Allocator segments (address order)" in titles
    assert "Allocation timeline (recorded history)" in titles
    alloc = figures(html)[0]  # the first screen's chart: the worst verdict's metric
    names = [t["name"] for t in alloc["data"]]
    # The leak's trend comes from the analyzer's verdict and is extrapolated to the limit; the
    # floors (memory held) and the checks are drawn with it.
    assert names == ["floor (held)", "device.allocated", "trend", "forecast", "check"], names
    assert any(s["type"] == "line" and s["yref"] == "paper" for s in alloc["layout"]["shapes"])
    assert sum(1 for a in alloc["layout"]["annotations"] if "end of epoch" in a["text"]) == 3
    assert "the analyzer&#x27;s verdict" in html and "reaches the 256.0 MiB limit" in html
    # Findings with the verdict and its suggestions; the failure's headline and request.
    assert "leak</b> on <code>device.allocated</code>" in html and "Try:" in html
    assert "The GPU ran out of memory (CUDA OOM) while allocating 120.0 MiB" in html
    # Allocator at the failure: the request is larger than all cached free memory.
    assert "is larger than all free cached memory: memory was full, not fragmented" in html
    assert "Largest live blocks" in html and "Largest free blocks" in html
    # History: the leaking function is named by its stack, largest first.
    top_live = html.index("Largest live allocations by stack")
    first_row = html[top_live:top_live + 1200]
    assert "cache_activations" in first_row, first_row
    assert "What this report could not show" not in html
    # What the memory charts share (their steps, the epoch-end marks) is in the page once.
    raw = re.search(r"id='mw-figures'>(.*?)</script>", html, re.S)
    assert raw is not None
    steps = json.dumps(figures(html)[1]["data"][0]["x"], separators=(",", ":"))
    assert raw.group(1).count(steps) == 1
    marked = [f for f in figures(html) if any("end of epoch 0" in a.get("text", "")
                                              for a in f["layout"]["annotations"] or [])]
    assert raw.group(1).count('"text":"end of epoch 0"') < len(marked)


def test_bundle_views_match_snapshot(bundle: Path) -> None:
    snap = open_bundle(bundle).snapshot()
    v = segments_view(snap, request=120 * MIB)
    assert v is not None
    fr = v["fragmentation"]
    live_blocks = [b for s in snap["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated"]
    assert fr["allocated"] == sum(b["size"] for b in live_blocks)
    assert fr["segments"] == len(snap["segments"])
    h = history_view(snap)
    assert h is not None and h["oom_events"], "the failing request is in the history"
    # Replaying the history ends where the allocator is: every live block is accounted for.
    assert h["live_at_end"] == fr["allocated"]
    assert h["top_live"][0]["count"] == 150 and "cache_activations" in h["top_live"][0]["stack"]
    # The stack starts at the user frame that allocated, not in the fake allocator.
    assert h["top_live"][0]["stack"].startswith("cache_activations")


def test_bundle_without_history_or_timeline(tmp_path: Path) -> None:
    b = rb.oom_bundle(tmp_path, history=False, epochs=1, steps=20, request=250 * MIB)
    html = render_bundle_html(open_bundle(b))
    assert "No allocation history in the snapshot" in html and "record_history=True" in html
    # Without timeline.jsonl (a bundle trimmed to its size cap) the report still renders.
    os.unlink(b / "timeline.jsonl")
    m = json.loads((b / "manifest.json").read_text())
    del m["files"]["timeline.jsonl"]
    m["trimmed"] = [{"file": "timeline.jsonl", "bytes": 1}]
    (b / "manifest.json").write_text(json.dumps(m))
    html = render_bundle_html(open_bundle(b))
    assert "No memory samples recorded" in html and "no timeline samples" in html
    assert "Trimmed to fit the bundle size cap: timeline.jsonl" in html
    assert "<summary>Allocator at the failure" in html and "Allocator segments" in html


def test_unsafe_snapshot_is_a_note_not_a_failure(bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / bundle.name
    shutil.copytree(bundle, b)

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("echo owned",))

    data = pickle.dumps({"segments": [Evil()]})
    (b / "snapshot.pickle").write_bytes(data)
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["snapshot.pickle"] = len(data)
    (b / "manifest.json").write_text(json.dumps(m))
    html = render_bundle_html(open_bundle(b))
    assert "snapshot.pickle not shown" in html and "posix.system" in html
    assert "device.allocated" in fig_titles(html)  # the rest of the report is there


def test_cli_report_bundle_and_export(bundle: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(bundle), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "Allocation timeline (recorded history)" in fig_titles(out.read_text())
    # The bundle's own report.html is the same report (written at the failure).
    assert "Allocation timeline (recorded history)" in fig_titles(
        (bundle / "report.html").read_text())


# ---------------------------------------------------------------- live run
def test_live_run_report(live: memwatch.MemWatch, tmp_path: Path) -> None:
    path = render_run(live, tmp_path / "sub" / "live.html")
    html = path.read_text()
    titles = fig_titles(html)
    assert "host.rss" in titles and "workers.uss" in titles
    workers = [f for f in figures(html) if f["layout"]["title"]["text"].startswith(
        "DataLoader workers: USS (solid) and RSS (dotted) per worker")]
    assert len(workers) == 1
    names = sorted(t["name"] for t in workers[0]["data"])
    assert names == ["worker 0 RSS", "worker 0 USS", "worker 1 RSS", "worker 1 USS"]
    for t in workers[0]["data"]:
        assert len(t["x"]) >= 3 and all(y > 0 for y in t["y"])
    d = from_run(live)
    for w in d.workers:
        assert all(u <= r for u, r in zip(w["uss"], w["rss"], strict=True))  # USS <= RSS
        assert w["uss"][-1] > w["uss"][0]  # each worker keeps what it produced: it grows
    # Every verdict of the run is on the page (whichever the analyzer reached under this load).
    for f in d.findings:
        assert f"<b>{f['kind']}</b> on <code>{f['metric']}</code>" in html, f
    assert "per-worker growth" in html  # how to read the workers chart


def test_live_run_on_a_device_shows_the_allocator_now(tmp_path: Path) -> None:
    dev = rb.HistoryDevice(256 * MIB)
    cache: list[int] = []
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                        watchdog=False) as mw:
        for _ in range(30):
            rb.train_step(dev)
            rb.cache_activations(dev, cache)
            mw.step()
        html = render_run(mw, tmp_path / "r.html").read_text()
    assert "<summary>Allocator now" in html and "Allocator segments (address order)" in html
    assert "Allocation timeline (recorded history)" in fig_titles(html)
    assert "cache_activations" in html


def test_trend_fit_needs_real_growth() -> None:
    steps = list(range(1, 301))
    flat = ReportData(title="t", source="export", steps=steps,
                      values={"host.rss": [100 * MIB + (s % 7) * 4096.0 for s in steps]},
                      epochs=[{"epoch": 0, "end_step": 100}, {"epoch": 1, "end_step": 200}],
                      limits={"host.rss": 1024 * MIB})
    t = fit_trend(flat, "host.rss")
    assert t is not None and not t.significant and t.limit_step is None
    grow = ReportData(title="t", source="export", steps=steps,
                      values={"host.rss": [100 * MIB + s * 64 * 1024.0 for s in steps]},
                      epochs=flat.epochs, limits={"host.rss": 1024 * MIB})
    t = fit_trend(grow, "host.rss")
    assert t is not None and t.significant and t.source == "fit"
    assert t.slope == pytest.approx(64 * 1024, rel=0.01)
    # The line 100 MiB + 64 KiB * step meets 1024 MiB at step 924 MiB / 64 KiB = 14,784.
    assert t.limit_step == pytest.approx(14784, rel=0.001)


# ---------------------------------------------------------------- exports
def _sink_run(tmp_path: Path) -> tuple[Path, memwatch.MemWatch]:
    log = tmp_path / "events.jsonl"
    held: list[bytes] = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        sinks=[JsonlSink(log)], log_every_n_steps=1, watchdog=False) as mw:
        for _ in range(3):
            for _ in range(40):
                held.append(os.urandom(64 * 1024))
                mw.step()
            mw.end_epoch()
    return log, mw


def test_export_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, mw = _sink_run(tmp_path)
    d = from_export(log)
    assert len(d.steps) == 120 and d.steps[0] == 1 and "host.rss" in d.values
    assert [e["end_step"] for e in d.epochs] == [40, 80, 120]
    assert len(d.findings) == len(mw.findings)
    for f in mw.findings:  # a verdict's limit stands in for the limits an export lacks
        if "limit_bytes" in f.evidence:
            assert d.limits[f.metric] == f.evidence["limit_bytes"]
    out = tmp_path / "from-jsonl.html"
    assert main(["report", str(log), "-o", str(out)]) == 0
    assert "host.rss" in fig_titles(out.read_text())
    csv_path = to_csv(mw, tmp_path / "t.csv")
    json_path = to_json(mw, tmp_path / "t.json")
    for p in (csv_path, json_path):
        html = render_export(p, tmp_path / f"{p.suffix[1:]}.html").read_text()
        fig = next(f for f in figures(html) if f["layout"]["title"]["text"] == "host.rss")
        series = next(t for t in fig["data"] if t["name"] == "host.rss")
        assert len(series["x"]) == 120, p
    assert len(from_export(json_path).epochs) == 3
    # Logger-key exports (W&B / CSV logger columns) are converted back to bytes.
    lk = tmp_path / "logged.csv"
    lk.write_text("step,memwatch/host.rss_gib,memwatch/val/host.rss_gib\n1,0.5,9\n2,0.75,9\n")
    d = from_export(lk)
    assert d.values == {"host.rss": [0.5 * 2**30, 0.75 * 2**30]}
    # A torn last line (a crash mid-write) is skipped with a note.
    with open(log, "a") as f:
        f.write('{"event":"sample","st')
    assert any("not JSON" in n for n in from_export(log).notes)
    capsys.readouterr()


def test_empty_and_unreadable_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    html = render(from_export(empty))
    assert "holds no sample rows" in html and "No memory samples recorded" in html
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    assert "not a JSON document" in capsys.readouterr().err


# ---------------------------------------------------------------- robustness
def test_a_failing_section_is_a_note(bundle: Path) -> None:
    d = from_bundle(open_bundle(bundle))
    # (fmt_bytes shows a value that is no number as "n/a": suggestions that cannot be iterated)
    d.findings = [{"kind": "leak", "severity": "warning", "bytes_per_step": "not a number",
                   "suggestions": 5}]
    d.workers = [{"index": 0}]  # malformed: no readings
    html = render(d)
    assert "The workers section could not be rendered (KeyError" in html
    assert "The findings section could not be rendered" in html
    assert "device.allocated" in fig_titles(html)
    assert html.count("<section") == html.count("</section>")


def test_without_plotly_and_rich(bundle: Path, tmp_path: Path) -> None:
    """A real interpreter where plotly and rich cannot be imported: tables and plain text."""
    code = f"""
import sys
sys.modules["plotly"] = None
sys.modules["rich"] = None
from memwatch.cli import main
assert main(["report", {str(bundle)!r}, "-o", {str(tmp_path / "r.html")!r}]) == 0
assert main(["inspect", {str(bundle)!r}, "--format", "auto"]) == 0
assert main(["inspect", {str(bundle)!r}, "--format", "rich"]) == 2
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert ("Charts are left out: plotly is not installed "
            "(pip install &#x27;memwatch[report]&#x27;)") in html
    assert "<script type='application/json'" not in html and "Largest live blocks" in html
    assert "How full memory was" in r.stdout and "Largest live tensors" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == (
        "memwatch inspect: error: the rich terminal view needs rich: "
        "pip install 'memwatch[report]'")
