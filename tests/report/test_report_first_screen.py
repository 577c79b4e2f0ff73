"""The report's first screen, in the document: one card per verdict (kind and severity, holder,
growth with its interval, forecast, fix, evidence), then the chart that shows it, then everything
else collapsed; a clean run in one line with its peaks. How it lays out in a browser window is
tests/report/test_report_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import report_builders as rb
from memwatch.bundle import open_bundle
from memwatch.report.data import ReportData, from_bundle
from memwatch.report.html import render, render_bundle_html
from memwatch.report.verdicts import cards, clean_line

MIB = rb.MIB
FIRST_SCREEN = ("header", "verdicts", "chart")


@pytest.fixture(scope="module")
def leak(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rb.leak_bundle_fresh(tmp_path_factory.mktemp("first-screen"))


def sections(html: str) -> dict[str, str]:
    return {k: v.strip() for k, v in
            re.findall(r"<section id='mw-([a-z]+)'>(.*?)</section>", html, re.S)}


def test_the_leak_card_says_who_how_fast_when_and_what_to_change(leak: Path) -> None:
    (c, *rest) = cards(from_bundle(open_bundle(leak)))
    assert not rest  # one verdict: the latest of each kind and metric, not one per epoch
    assert (c.kind, c.metric, c.severity) == ("leak", "host.rss", "warning")
    assert c.holder == "report_builders.KEPT"
    assert c.holder_detail is not None and "float32[131072]" in c.holder_detail
    assert c.rate is not None and re.fullmatch(
        r"[\d.]+ KiB/step \(95% CI [\d.]+ KiB–[\d.]+ KiB per step\)", c.rate), c.rate
    assert c.forecast is not None and re.match(r"the [\d.]+ GiB limit is reached in about",
                                               c.forecast), c.forecast
    assert c.fix is not None and c.fix.startswith("`KEPT` grows every step: bound it")
    found = {e.name: e.found for e in c.evidence}
    assert found == {"trend statistics": True, "census diff": True, "allocation sites": False}
    census = next(e for e in c.evidence if e.name == "census diff")
    assert census.detail.startswith("epochs ")


def test_first_screen_then_everything_else_collapsed(leak: Path) -> None:
    html = render_bundle_html(open_bundle(leak))
    secs = sections(html)
    assert list(secs)[:3] == list(FIRST_SCREEN)
    assert html.index("id='mw-card-0'") < html.index("class='chart'") < html.index(
        "<details id='mw-more-")
    # The chart that shows the verdict: its metric, floors, trend and checks.
    assert "<div class='chart' id='mw-chart-0'>" in secs["chart"]
    assert "<code>host.rss</code>: samples" in secs["chart"]
    for name, body in secs.items():
        if name in FIRST_SCREEN or not body:
            continue
        assert body.startswith("<details id='mw-more-") and body.endswith("</details>"), name
    # The card: holder, fix as code, evidence chips, the analyzer's message one click away.
    card = secs["verdicts"]
    assert "<b class='holder'>report_builders.KEPT</b>" in card
    assert "<b class='fix'><code>KEPT</code> grows every step" in card
    assert "✓ census diff" in card and "– allocation sites" in card
    assert "<summary>The analyzer's words</summary>" in card


def test_a_low_severity_leak_still_gets_its_card() -> None:
    # The demo's case: a leak whose forecast lies after the run's end is an `info` finding.
    f = {"kind": "leak", "metric": "host.rss", "severity": "info", "message": "grows",
         "bytes_per_step": 2 * MIB, "steps_to_oom": 10_000, "seconds_to_oom": 100,
         "suggestions": ["store `loss.item()`"], "epoch": 4, "step": 240,
         "evidence": {"limit_bytes": 24 * 2**30, "remaining_steps": 720}}
    plateau = {**f, "kind": "plateau", "metric": "host.uss", "bytes_per_step": None}
    d = ReportData(title="t", source="live run", findings=[plateau, f])
    (c,) = cards(d)
    assert c.kind == "leak" and c.when == "epoch 4, step 240"
    assert c.forecast == ("the 24.0 GiB limit would be reached in about 10,000 steps (100 s), "
                          "after this run ends (720 steps left): not a threat to this run")


def test_a_clean_run_says_so_in_one_line_with_its_peaks() -> None:
    steps = list(range(1, 121))
    d = ReportData(title="t", source="live run", steps=steps,
                   values={"host.rss": [300 * MIB + (s % 7) * MIB for s in steps],
                           "device.allocated": [2 * 2**30] * 120},
                   limits={"device.allocated": 8 * 2**30},
                   epochs=[{"epoch": e, "end_step": 40 * (e + 1)} for e in range(3)])
    assert clean_line(d) == ("No leak and no out-of-memory risk found: 3 epoch end(s) and 120 "
                             "steps judged. Peak: device.allocated 2.0 GiB (25% of 8.0 GiB); "
                             "host.rss 306.0 MiB.")
    html = render(d, plotly="/* plotly stand-in */")
    secs = sections(html)
    assert "mw-card-" not in html
    assert secs["verdicts"] == f"<p class='clean'>{clean_line(d)}</p>"
    assert "id='mw-chart-0'" in secs["chart"]  # the peak, drawn


def test_the_failure_is_said_in_one_shortened_line() -> None:
    msg = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 2.00 "
           "GiB of which 1.34 GiB is free. " * 4)
    d = ReportData(title="t", source="bundle", headline="The GPU ran out of memory.",
                   exception={"type": "torch.OutOfMemoryError", "message": msg,
                              "traceback": "Traceback ...\n" + msg},
                   fullness=[{"metric": "device.reserved", "value": 1.9 * 2**30,
                              "limit": 2 * 2**30, "utilization": 0.95}])
    head = sections(render(d, with_charts=False))["header"]
    line = re.search(r"<span class='exc'>(.*?)</span>", head)
    assert line is not None
    text = line.group(1)
    assert text.endswith("…") and len(text) < 300
    assert text[:-1].rstrip().split()[-1] in msg.split()  # cut where a word ends
    assert "Fullest at the failure: device.reserved, 1.9 GiB of 2.0 GiB (95.0%)." in head


def test_a_loop_without_epochs_is_told_in_steps_and_a_failed_test_is_not_a_pass() -> None:
    # A warning whose trend test alone did not pass (the verdict rests on growth held across
    # checks): its chip says so, never "✓"; and no epoch language for a loop without epochs.
    f = {"kind": "leak", "metric": "host.rss", "severity": "warning", "message": "grows.",
         "bytes_per_step": 100 * 1024.0, "step": 1200, "epoch": 0, "check": 4,
         "evidence": {"mann_kendall_p": 0.2, "epochs_growing": 5, "census_epochs": [0, 0],
                      "census_at_steps": [800, 1200], "holder": "train.cache",
                      "explained_bytes": 40e6, "rss_growth_bytes": 40e6}}
    d = ReportData(title="t", source="live run", findings=[f], current=[f], has_epochs=False)
    (c,) = cards(d)
    ev = {e.name: e for e in c.evidence}
    assert not ev["trend statistics"].found
    assert ev["trend statistics"].detail == ("Mann–Kendall p = 0.2 (not significant alone: "
                                              "p ≥ 0.01), growing at 5 check(s)")
    assert ev["census diff"].found and ev["census diff"].detail.startswith("steps 800→1,200")
    assert c.when == "step 1,200"
    html = render(d, with_charts=False)
    assert "– trend statistics" in html and "✓ trend statistics" not in html
    assert "epoch" not in html.lower()
    # With epochs, the same words as ever.
    d.has_epochs = True
    assert cards(d)[0].when == "epoch 0, step 1,200"
