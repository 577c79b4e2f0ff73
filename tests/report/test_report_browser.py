"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package).

Each report is opened from a file with the network cut off (a proxy that refuses connections and a
resolver that resolves nothing) and checked for what a person would see: every chart drawn with
data (plotly's SVG traces in the DOM after the scripts ran), no console message and no script
error, no resource fetched by the page. A screenshot of each is kept as a build artefact under
``benchmarks/results/report-screenshots/`` (gitignored).

Chromium is installed by the session fixture when missing (``apt-get``, as root); the tests skip,
saying why, only when that is impossible.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import report_builders as rb
from memwatch.bundle import open_bundle
from memwatch.report.html import render_bundle_html, render_run, write_html

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "benchmarks" / "results" / "report-screenshots"
# No network, no background services: the page must work on an air-gapped machine.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--proxy-server=http://127.0.0.1:9",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000",
         "--hide-scrollbars"]
# Appended to a copy of the report: lists every resource the page fetched (none expected).
_PROBE = ("<pre id='mw-resources'></pre><script>document.getElementById('mw-resources')"
          ".textContent=JSON.stringify(performance.getEntriesByType('resource')"
          ".map(function(e){return e.name}));</script></body>")


@pytest.fixture(scope="session")
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be (needs apt-get as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log = []
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            pytest.skip(f"installing chromium timed out ({' '.join(cmd)})")
        # An `update` that fails for one mirror may still leave usable lists: try the install.
        log.append(r.stdout[-2000:] + r.stderr[-2000:])
    exe = shutil.which("chromium")
    if not exe:
        pytest.skip("chromium could not be installed: " + " | ".join(log)[-1500:])
    return exe


def open_in_chromium(exe: str, page: Path, profile: Path, shot: Path) -> tuple[str, str]:
    """(DOM after the scripts ran, browser log); also saves a 1280x2000 screenshot to ``shot``."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text().replace("</body>", _PROBE, 1))
    common = [exe, *FLAGS, f"--user-data-dir={profile}"]
    r = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom",
                        probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    shot.parent.mkdir(parents=True, exist_ok=True)
    s = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1280,2000",
                        page.as_uri()], capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and shot.is_file(), s.stderr[-3000:]
    return r.stdout, r.stderr


def check_page(dom: str, log: str, n_figures: int, shot: Path) -> None:
    console = [ln for ln in log.splitlines() if ":CONSOLE" in ln]
    assert not console, "console messages:\n" + "\n".join(console)
    errors = re.search(r'<pre id="mw-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == "", errors
    resources = re.search(r'<pre id="mw-resources">(.*?)</pre>', dom, re.S)
    assert resources is not None and resources.group(1) == "[]", resources.group(1)
    assert f'data-charts-rendered="{n_figures}"' in dom
    # Every chart has drawn data: an SVG line path or bar with coordinates inside its div.
    for i in range(n_figures):
        start = dom.index(f'id="mw-chart-{i}"')
        end = dom.find(f'id="mw-chart-{i + 1}"', start)
        div = dom[start:end if end > 0 else len(dom)]
        assert 'data-rendered="1"' in div[:200], f"chart {i} not rendered"
        assert re.search(r'class="js-line" d="M[\d.]+,[\d.]+[LHV]', div) or re.search(
            r'<g class="point"><path d="M[\d.]+,', div), f"chart {i} has no drawn data"
    with open(shot, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1280, 2000)
    assert shot.stat().st_size > 30_000, "the screenshot looks blank"


# The first test may install chromium (apt-get: a minute or two on a fresh CI machine).
@pytest.mark.timeout(1200)
def test_bundle_report_in_chromium(chromium: str, tmp_path: Path) -> None:
    bundle = rb.oom_bundle(tmp_path / "run")
    page = write_html(render_bundle_html(open_bundle(bundle)), tmp_path / "bundle.html")
    n = page.read_text().count("<div class='chart' id='mw-chart-")
    assert n >= 5  # memory metrics, allocator segments, allocation timeline
    shot = ARTIFACTS / "bundle-report.png"
    dom, log = open_in_chromium(chromium, page, tmp_path / "profile", shot)
    check_page(dom, log, n, shot)
    assert "Largest live allocations by stack" in dom and "cache_activations" in dom
    # The bundle's own report.html (written at the failure) is the same page.
    own = (bundle / "report.html").read_text()
    assert own.count("<div class='chart' id='mw-chart-") == n


@pytest.mark.timeout(1200)
def test_live_run_report_in_chromium(chromium: str, tmp_path: Path) -> None:
    mw = rb.live_run_with_workers(tmp_path / "run")
    page = render_run(mw, tmp_path / "live.html")
    n = page.read_text().count("<div class='chart' id='mw-chart-")
    shot = ARTIFACTS / "live-run-report.png"
    dom, log = open_in_chromium(chromium, page, tmp_path / "profile", shot)
    check_page(dom, log, n, shot)
    assert "worker 1 USS" in dom  # the per-worker legend was drawn
