"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package).

Each report is opened from a file with the network cut off (a proxy that refuses connections and a
resolver that resolves nothing) and checked for what a person would see: every chart drawn with
data (plotly's SVG traces in the DOM after the scripts ran; the collapsed sections opened for
that), no console message and no script error, no resource fetched by the page. The first screen
of a leak report is measured in a 1400×900 window: the holder's name and the fix lie inside it
(their boxes, as the browser laid them out), only its chart is drawn at load, and a collapsed
section's charts are drawn when it is opened. A screenshot of each is kept as a build artefact
under ``benchmarks/results/report-screenshots/`` (gitignored).

Chromium is installed by the session fixture when missing (``apt-get``, as root); the tests skip,
saying why, only when that is impossible.
"""

from __future__ import annotations

import html
import json
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
    """(DOM after the scripts ran, browser log), every collapsed section opened (so that every
    chart is drawn); also saves a 1280x2000 screenshot of the page as it opens to ``shot``."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text().replace("<details", "<details open")
                     .replace("</body>", _PROBE, 1))
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
    assert f'data-charts-rendered="{n_figures}"' in dom, "not every chart was drawn"
    assert f'data-charts-total="{n_figures}"' in dom
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


# Written into the page once it has drawn: the layout boxes of the first card's holder and fix,
# the charts drawn; then a collapsed section is opened and what it drew is recorded too.
_GEOMETRY = """<pre id='mw-geometry'></pre><script>
function mwBox(sel){var e=document.querySelector(sel);if(!e){return null;}
  var b=e.getBoundingClientRect();
  return {top:b.top,bottom:b.bottom,left:b.left,right:b.right,text:e.textContent};}
function mwDrawn(){return document.querySelectorAll('.chart[data-rendered]').length;}
window.addEventListener('load',function(){setTimeout(function(){
  var g={width:window.innerWidth,scrollY:window.scrollY,holder:mwBox('#mw-card-0 .holder'),
         fix:mwBox('#mw-card-0 .fix'),chart:mwBox('.chart'),drawn_at_load:mwDrawn(),
         charts:document.querySelectorAll('.chart').length};
  var more=document.getElementById('mw-more-memory');
  g.memory_charts=more?more.querySelectorAll('.chart').length:0;
  more.open=true;
  setTimeout(function(){g.drawn_after_open=mwDrawn();
    document.getElementById('mw-geometry').textContent=JSON.stringify(g);},1000);
},500);});
</script></body>"""

#: The first screen: what a person sees without scrolling on a laptop-sized window.
SCREEN = (1400, 900)


@pytest.mark.fresh_process  # the leak bundle's run starts as a fresh process does
@pytest.mark.timeout(1200)
def test_first_screen_of_a_leak_report(chromium: str, tmp_path: Path) -> None:
    bundle = rb.leak_bundle(tmp_path / "run")
    page = write_html(render_bundle_html(open_bundle(bundle)), tmp_path / "leak.html")
    probe = page.with_name("leak.geometry.html")
    probe.write_text(page.read_text().replace("</body>", _GEOMETRY, 1))
    common = [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
              f"--window-size={SCREEN[0]},{SCREEN[1]}"]
    r = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom",
                        probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = re.search(r'<pre id="mw-geometry">(.*?)</pre>', r.stdout, re.S)
    assert got is not None and got.group(1), r.stdout[-2000:]
    g = json.loads(html.unescape(got.group(1)))
    assert g["width"] == SCREEN[0] and g["scrollY"] == 0
    # The answer is on the first screen: who holds the memory, and what to change.
    for what in ("holder", "fix"):
        box = g[what]
        assert box is not None, f"no {what} on the first card"
        assert 0 <= box["top"] and box["bottom"] <= SCREEN[1], (what, box)
        assert 0 <= box["left"] and box["right"] <= SCREEN[0], (what, box)
    assert g["holder"]["text"] == "report_builders.KEPT"
    assert "KEPT" in g["fix"]["text"] and "bound it" in g["fix"]["text"]
    # The chart that shows it starts on the first screen too, and it alone is drawn at load;
    # the collapsed sections draw their charts when opened.
    assert g["chart"]["top"] < SCREEN[1]
    assert g["drawn_at_load"] == 1 and g["charts"] > 1
    assert g["memory_charts"] >= 1
    assert g["drawn_after_open"] == 1 + g["memory_charts"]
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, "console messages:\n" + "\n".join(console)
    shot = ARTIFACTS / "leak-first-screen.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    s = subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                       text=True, timeout=120)
    assert s.returncode == 0 and shot.is_file(), s.stderr[-3000:]
    with open(shot, "rb") as f:
        head = f.read(24)
    assert struct.unpack(">II", head[16:24]) == SCREEN
