"""A self-contained HTML report: one file that opens offline, with interactive charts.

Training clusters are often air-gapped, so the page carries everything: its CSS, its data and
plotly.js itself, inlined from the ``plotly`` package (``pip install 'memwatch[report]'``; without
it the report still renders, with tables and a note in place of charts). It loads nothing from the
network. Three sources render the same way (see :mod:`memwatch.report.data`):

* a live run: :func:`render_run` (``render_run(mw, "report.html")``);
* an OOM bundle: :func:`render_bundle_html` / ``memwatch report BUNDLE -o report.html`` (and every
  bundle's own ``report.html``);
* a JSONL or CSV export of samples: :func:`render_export` / ``memwatch report run.jsonl``.

Sections: memory over steps per metric (epoch ends, fitted trend, forecast to the limit), how full
memory was, DataLoader workers (USS vs RSS), findings with culprits and suggestions, the largest
live tensors, and for a bundle the allocator at the failure (segments, largest blocks,
fragmentation) and, with allocation history, an allocation timeline and the largest allocations
by stack. A section whose data is missing says so; a section that fails to render becomes a note.
The report is never the reason a run or a bundle fails.

Example::

    >>> import os, memwatch
    >>> from memwatch.report.html import render_run
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp), signals=False) as mw:
    ...     for _ in range(20):
    ...         mw.step()
    ...     path = render_run(mw, os.path.join(tmp, "report.html"))
    >>> path.read_text().startswith("<!DOCTYPE html>")
    True
"""

from __future__ import annotations

import html as _html
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwatch.report import charts
from memwatch.report.allocator import history_view, segments_view
from memwatch.report.data import CHART_METRICS, ReportData, from_bundle, from_export, from_run
from memwatch.report.summary import latest_findings, tensor_label
from memwatch.units import fmt_bytes

if TYPE_CHECKING:
    from memwatch.bundle import Bundle
    from memwatch.session import MemWatch

__all__ = ["render", "render_bundle_html", "render_export", "render_run", "write_html"]

INSTALL_HINT = "pip install 'memwatch[report]'"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;
max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.45em;margin-bottom:.2em}h2{font-size:1.15em;border-bottom:1px solid #ddd;
padding-bottom:.2em;margin-top:1.8em}h3{font-size:1em;margin:1.2em 0 .3em}
table{border-collapse:collapse;width:100%;margin:.4em 0}td,th{border-bottom:1px solid #eee;
padding:.25em .5em;text-align:left;vertical-align:top}th{background:#f6f6f6;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.headline{font-size:1.15em;background:#fff4f4;border-left:4px solid #d62728;padding:.6em 1em}
.bar{background:#eee;width:200px;height:12px;display:inline-block;vertical-align:middle}
.bar>span{display:block;height:12px}
pre{background:#f6f6f6;padding:.8em;overflow:auto;max-height:28em;font-size:12px;
white-space:pre-wrap;word-break:break-word}
.sev-critical{color:#b00020;font-weight:700}.sev-warning{color:#a65f00;font-weight:600}
.sev-info{color:#2a6f2a}.muted{color:#777}
.meta span{margin-right:1.2em;display:inline-block;max-width:100%;overflow-wrap:anywhere}
.chart{min-height:300px;border:1px solid #eee;margin:.6em 0 .2em}
.caption{font-size:12.5px;color:#555;margin:0 0 1em}
.finding{border:1px solid #e4e4e4;border-left:4px solid #999;padding:.5em .9em;margin:.6em 0}
.finding.critical{border-left-color:#b00020}.finding.warning{border-left-color:#e69500}
.finding.info{border-left-color:#2ca02c}.finding ul{margin:.3em 0 .2em 1.2em;padding:0}
.note{background:#fffbe6;border-left:4px solid #e6c200;padding:.4em .8em;margin:.4em 0}
code{background:#f3f3f3;padding:0 .25em}
#mw-errors{display:none}
"""

# Installed before plotly.js so that any script error anywhere is kept in the page, where a
# headless browser test (and a person) can see it.
_ERROR_HOOK = """
window.__mwErrors=[];
window.addEventListener('error',function(e){window.__mwErrors.push(String(e.message||e));
var p=document.getElementById('mw-errors');if(p){p.textContent=window.__mwErrors.join('\\n');}});
"""

_DRAW = """
(function(){
var figs=JSON.parse(document.getElementById('mw-figures').textContent);
var ok=0;
figs.forEach(function(f){
  var el=document.getElementById(f.id);
  try{Plotly.newPlot(el,f.data,f.layout,{displaylogo:false,responsive:true});
      el.setAttribute('data-rendered','1');ok++;}
  catch(err){window.__mwErrors.push(f.id+': '+err);
      el.textContent='This chart could not be drawn: '+err;}
});
document.body.setAttribute('data-charts-rendered',String(ok));
var p=document.getElementById('mw-errors');
if(p){p.textContent=window.__mwErrors.join('\\n');}
})();
"""


def _e(x: Any) -> str:
    return _html.escape(str(x), quote=True)


def _json_for_script(obj: Any) -> str:
    # "<" escaped so that no "</script>" inside the data can end the script element.
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


class _Page:
    """Accumulates sections and chart figures; renders them into one document."""

    def __init__(self, d: ReportData, with_charts: bool) -> None:
        self.d = d
        self.with_charts = with_charts
        self.parts: list[str] = []
        self.figures: list[dict[str, Any]] = []
        self.notes: list[str] = list(d.notes)

    def add(self, html: str) -> None:
        self.parts.append(html)

    def chart(self, fig: dict[str, Any] | None, caption: str = "") -> None:
        if fig is None:
            return
        if not self.with_charts:
            if caption:
                self.add(f"<p class='caption'>{caption}</p>")
            return
        fid = f"mw-chart-{len(self.figures)}"
        self.figures.append({"id": fid, **fig})
        self.add(f"<div class='chart' id='{fid}'></div>")
        if caption:
            self.add(f"<p class='caption'>{caption}</p>")

    def section(self, name: str, fn: Callable[[_Page], None]) -> None:
        mark = len(self.parts)
        nfig = len(self.figures)
        try:
            self.add(f"<section id='mw-{name}'>")
            fn(self)
            self.add("</section>")
        except Exception as e:  # noqa: BLE001 - one section never costs the whole report
            del self.parts[mark:]
            del self.figures[nfig:]
            self.notes.append(f"The {name} section could not be rendered "
                              f"({type(e).__name__}: {e}).")


# --------------------------------------------------------------------------- sections
def _header(p: _Page) -> None:
    d = p.d
    p.add(f"<h1>{_e(d.title)}</h1>")
    p.add("<p class='meta muted'>" + " ".join(
        f"<span>{_e(k)}: <b>{_e(v)}</b></span>" for k, v in d.meta) + "</p>")
    if d.headline:
        p.add(f"<p class='headline'>{_e(d.headline)}</p>")
    if d.exception:
        msg = str(d.exception.get("message", "")).strip()
        p.add(f"<p><b>{_e(d.exception.get('type', ''))}</b></p><pre>{_e(msg[:4000])}</pre>")
    ranked = sorted(latest_findings(d.findings), key=_severity_rank)
    bad = [f for f in ranked if f.get("severity") in ("warning", "critical")]
    if bad:
        p.add("<p><b>Verdicts:</b> " + "; ".join(
            f"<span class='sev-{_e(f.get('severity'))}'>{_e(f.get('kind'))}</span> on "
            f"<code>{_e(f.get('metric'))}</code>" for f in bad[:6]) + " (details below).</p>")
    elif d.findings or d.epochs:
        p.add("<p><b>Verdicts:</b> no warning or critical finding.</p>")


def _severity_rank(f: dict[str, Any]) -> int:
    return {"critical": 0, "warning": 1, "info": 2}.get(str(f.get("severity")), 3)


def _memory(p: _Page) -> None:
    d = p.d
    p.add("<h2>Memory over steps</h2>")
    metrics: list[str] = []
    for m in CHART_METRICS:
        col = d.values.get(m) or []
        # All-zero series (no swap) and exact repeats of a charted series (active == allocated
        # without multiple streams) add a chart and say nothing new.
        if any(v for v in col) and all(col != d.values.get(o) for o in metrics):
            metrics.append(m)
    if not metrics:
        p.add("<p class='muted'>No memory samples recorded.</p>")
        return
    p.add("<p class='caption'>One chart per metric (raw samples; dotted vertical lines are epoch "
          "ends). The dashed red line is the trend of the memory <i>held</i> (the floors after "
          "the first epoch, or the analyzer's rate when it gave a verdict), dotted where it is "
          "extrapolated to the limit.</p>")
    for m in metrics:
        got = charts.memory_chart(d, m)
        if got is None:
            continue
        fig, trend = got
        vals = [v for v in d.values[m] if v is not None]
        cap = (f"<code>{_e(m)}</code>: last {_e(fmt_bytes(vals[-1]))}, "
               f"max {_e(fmt_bytes(max(vals)))}")
        if trend is not None:
            cap += f"; trend {_e(trend.describe())}"
        limit = d.limits.get(m)
        if limit and (trend is None or trend.limit is None or trend.limit_step is None):
            cap += f"; limit {_e(fmt_bytes(limit))} ({max(vals) / limit * 100:.1f}% at the max)"
        p.chart(fig, cap + ".")


def _fullness(p: _Page) -> None:
    d = p.d
    if not d.fullness:
        return
    p.add("<h2>How full memory was</h2><table><tr><th>metric</th><th>value</th><th>limit</th>"
          "<th>used</th></tr>")
    for r in d.fullness:
        u = float(r["utilization"])
        color = "#d62728" if u >= 0.95 else "#ff7f0e" if u >= 0.85 else "#2ca02c"
        p.add(f"<tr><td>{_e(r['metric'])}</td><td class='n'>{_e(fmt_bytes(r['value']))}</td>"
              f"<td class='n'>{_e(fmt_bytes(r['limit']))}</td><td><span class='bar'><span "
              f"style='width:{min(u, 1) * 100:.0f}%;background:{color}'></span></span> "
              f"{u * 100:.1f}%</td></tr>")
    p.add("</table>")


def _workers(p: _Page) -> None:
    d = p.d
    fig = charts.workers_chart(d)
    if fig is None:
        return
    p.add("<h2>DataLoader workers</h2>")
    p.chart(fig, "RSS counts every page a worker maps, shared ones included (each worker counts "
                 "the parent's copy-on-write pages again); USS is the memory only that worker "
                 "holds. USS rising while RSS stays flat is copy-on-write (Python touching the "
                 "parent's objects); both rising across epochs is per-worker growth.")
    if d.workers:
        p.add("<table><tr><th>worker</th><th>pids</th><th>last RSS</th><th>last USS</th></tr>")
        for w in d.workers:
            p.add(f"<tr><td>{_e(w['index'])}</td><td>{_e(', '.join(map(str, w['pids'])))}</td>"
                  f"<td class='n'>{_e(fmt_bytes(w['rss'][-1]))}</td>"
                  f"<td class='n'>{_e(fmt_bytes(w['uss'][-1]))}</td></tr>")
        p.add("</table>")


def _findings(p: _Page) -> None:
    d = p.d
    latest = sorted(latest_findings(d.findings), key=_severity_rank)
    p.add(f"<h2>Findings ({len(d.findings)})</h2>")
    if len(latest) < len(d.findings):
        p.add("<p class='muted'>The analyzer restates a verdict at every epoch end; the latest "
              "of each kind and metric is shown.</p>")
    if not latest:
        p.add("<p class='muted'>No findings.</p>")
        return
    for f in latest:
        sev = str(f.get("severity", ""))
        figures = []
        if f.get("bytes_per_step"):
            figures.append(f"{fmt_bytes(f['bytes_per_step'])}/step")
        if f.get("steps_to_oom"):
            figures.append(f"OOM in ~{int(f['steps_to_oom']):,} steps")
        if f.get("seconds_to_oom"):
            figures.append(f"~{float(f['seconds_to_oom']) / 60:.0f} min")
        if f.get("epoch") is not None:
            figures.append(f"epoch {f['epoch']}")
        p.add(f"<div class='finding {_e(sev)}'><b class='sev-{_e(sev)}'>{_e(sev)}</b> "
              f"<b>{_e(f.get('kind', ''))}</b> on <code>{_e(f.get('metric', ''))}</code> "
              f"<span class='muted'>{_e(' · '.join(figures))}</span>"
              f"<div>{_e(f.get('message', ''))}</div>")
        if f.get("culprit"):
            p.add(f"<div><b>Culprit:</b> {_e(f['culprit'])}</div>")
        tips = [t for t in f.get("suggestions") or [] if t]
        if tips:
            p.add("<b>Try:</b><ul>" + "".join(f"<li>{_e(t)}</li>" for t in tips) + "</ul>")
        p.add("</div>")


def _tensors(p: _Page) -> None:
    d = p.d
    if d.source != "bundle" and not d.top_tensors:
        return
    p.add("<h2>Largest live tensors</h2>")
    if not d.top_tensors:
        p.add(f"<p class='muted'>{_e(d.census_note or 'No census recorded.')}</p>")
        return
    p.add("<table><tr><th>bytes</th><th>count</th><th>tensor</th><th>held by</th></tr>")
    for t in d.top_tensors[:20]:
        p.add(f"<tr><td class='n'>{_e(fmt_bytes(t.get('bytes')))}</td><td class='n'>"
              f"{_e(t.get('count', ''))}</td><td>{_e(tensor_label(t))}</td><td>"
              f"{_e(t.get('holder') or '')}</td></tr>")
    p.add("</table>")


def _blocks_table(rows: list[dict[str, Any]], title: str) -> str:
    if not rows:
        return ""
    out = [f"<h3>{_e(title)}</h3><table><tr><th>size</th><th>requested</th><th>segment</th>"
           "<th>state</th><th>allocated by</th></tr>"]
    for b in rows:
        out.append(f"<tr><td class='n'>{_e(fmt_bytes(b['size']))}</td><td class='n'>"
                   f"{_e(fmt_bytes(b['requested']) if b['requested'] else '')}</td><td class='n'>"
                   f"#{_e(b['segment'])}</td><td>{_e(b['state'])}</td><td>"
                   f"{_e(b['stack'] or '')}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _allocator(p: _Page) -> None:
    d = p.d
    request = None
    if d.exception:
        request = (d.exception.get("numbers") or {}).get("tried_to_allocate")
    view = segments_view(d.snapshot, request if isinstance(request, int) else None)
    stats = (d.allocator_stats or {}).get("memory_stats") if d.allocator_stats else None
    if view is None and not stats:
        if d.source == "bundle":
            p.add("<h2>Allocator at the failure</h2><p class='muted'>No allocator snapshot or "
                  "statistics in this bundle (a host-only run has no device allocator).</p>")
        return
    p.add("<h2>Allocator at the failure</h2>" if d.source == "bundle" else
          "<h2>Allocator now</h2>")
    if view is not None:
        fr = view["fragmentation"]
        line = (f"{fr['segments']} segments hold {fmt_bytes(fr['reserved'])}: "
                f"{fmt_bytes(fr['allocated'])} in live blocks and "
                f"{fmt_bytes(fr['free_in_segments'])} free inside the segments, in "
                f"{fr['free_blocks']} free blocks; the largest free block is "
                f"{fmt_bytes(fr['largest_free'])} (fragmentation {fr['ratio'] * 100:.0f}%: "
                "the share of free cached memory outside the largest free block).")
        if fr.get("request"):
            req = fr["request"]
            if fr["free_in_segments"] >= req > fr["largest_free"]:
                line += (f" The failing request of {fmt_bytes(req)} would have fit in the free "
                         "memory had it been contiguous: fragmentation contributed to this OOM "
                         "(try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).")
            elif req > fr["free_in_segments"]:
                line += (f" The failing request of {fmt_bytes(req)} is larger than all free "
                         "cached memory: memory was full, not fragmented.")
        p.add(f"<p>{_e(line)}</p>")
        p.chart(charts.segments_chart(view))
        p.add(_blocks_table(view["largest_live"], "Largest live blocks"))
        p.add(_blocks_table(view["largest_free"], "Largest free blocks"))
    if stats:
        p.add("<details><summary>Allocator statistics (memory_stats)</summary><table>")
        for k in sorted(stats)[:300]:
            v = stats[k]
            shown = fmt_bytes(v) if "bytes" in k and isinstance(v, (int, float)) else v
            p.add(f"<tr><td>{_e(k)}</td><td class='n'>{_e(shown)}</td></tr>")
        p.add("</table></details>")


def _history(p: _Page) -> None:
    d = p.d
    hist = history_view(d.snapshot)
    if hist is None:
        if d.snapshot is not None:
            p.add("<p class='muted'>No allocation history in the snapshot: run with "
                  "<code>MemWatch(record_history=True)</code> to see who allocated what "
                  "(see docs/troubleshooting.md for its cost).</p>")
        return
    p.add("<h2>Allocation history</h2>")
    p.chart(charts.allocation_timeline(hist),
            f"{hist['events']:,} allocator events replayed; {_e(fmt_bytes(hist['live_at_end']))} "
            "still allocated at the end of the history. Dashed red lines: OOM events.")
    for key, title in (("top_live", "Largest live allocations by stack (at the failure)"),
                       ("top_allocated", "Most bytes allocated by stack (whole history)")):
        rows = hist[key]
        if not rows:
            continue
        p.add(f"<h3>{_e(title)}</h3><table><tr><th>bytes</th>"
              + ("<th>count</th>" if key == "top_live" else "") + "<th>stack (innermost "
              "user frame first)</th></tr>")
        for r in rows:
            cnt = f"<td class='n'>{_e(r['count'])}</td>" if key == "top_live" else ""
            p.add(f"<tr><td class='n'>{_e(fmt_bytes(r['bytes']))}</td>{cnt}<td>"
                  f"{_e(r['stack'])}</td></tr>")
        p.add("</table>")


def _details(p: _Page) -> None:
    d = p.d
    if d.exception and d.exception.get("traceback"):
        p.add("<h2>Traceback</h2><pre>" + _e(d.exception["traceback"]) + "</pre>")
    if d.environment:
        p.add("<h2>Environment</h2><table>")
        for k in ("python", "platform", "torch", "torch_cuda", "device", "rank", "argv", "env"):
            if k in d.environment:
                v = d.environment[k]
                if isinstance(v, dict):
                    v = ", ".join(f"{a}={b}" for a, b in v.items())
                elif isinstance(v, list):
                    v = " ".join(str(x) for x in v)
                p.add(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>")
        p.add("</table>")
    if d.files:
        p.add("<h2>Files</h2><table>" + "".join(
            f"<tr><td>{_e(f)}</td><td class='n'>{_e(fmt_bytes(b))}</td></tr>"
            for f, b in d.files.items()) + "</table>")


# --------------------------------------------------------------------------- assembly
def render(d: ReportData, plotly: str | None = None, with_charts: bool = True) -> str:
    """The report of ``d`` as one HTML document (never raises for missing data).

    ``plotly`` is the plotly.js text to inline; by default the ``plotly`` package's own copy.
    Without it (or with ``with_charts=False``) the charts are left out and the page says so.
    """
    js = None
    if with_charts:
        js = plotly if plotly is not None else charts.plotly_js()
    p = _Page(d, with_charts=js is not None)
    for name, fn in (("header", _header), ("memory", _memory), ("fullness", _fullness),
                     ("workers", _workers), ("findings", _findings), ("tensors", _tensors),
                     ("allocator", _allocator), ("history", _history), ("details", _details)):
        p.section(name, fn)
    if js is None and with_charts:
        p.notes.insert(0, f"Charts are left out: plotly is not installed ({INSTALL_HINT}).")
    notes = ""
    if p.notes:
        notes = "<h2>What this report could not show</h2>" + "".join(
            f"<p class='note'>{_e(n)}</p>" for n in p.notes)
    foot = ("<p class='muted'>Generated by memwatch; self-contained, works offline."
            + (f" In a terminal: <code>{_e(d.cli_hint)}</code>." if d.cli_hint else "") + "</p>")
    head = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{_e(d.title)}</title><style>{_CSS}</style>"
            f"<script>{_ERROR_HOOK}</script></head><body>")
    scripts = ""
    if js is not None and p.figures:
        scripts = (f"<script>{js}</script>"
                   f"<script type='application/json' id='mw-figures'>"
                   f"{_json_for_script(p.figures)}</script><script>{_DRAW}</script>")
    return "\n".join([head, *p.parts, notes, foot, "<pre id='mw-errors'></pre>", scripts,
                      "</body></html>\n"])


def write_html(html: str, path: str | os.PathLike[str]) -> Path:
    """Write ``html`` to ``path`` atomically (a reader never sees half a report)."""
    out = Path(os.path.abspath(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return out


def render_bundle_html(bundle: Bundle, display_path: str | None = None) -> str:
    """The report of ``bundle`` as one HTML string (raises BundleError on corrupted files).

    Written by the flight recorder at the failure, when memory may be exhausted: if the page with
    its 5 MB of inlined plotly.js does not fit, the tables alone are rendered (a few KiB), and
    ``memwatch report BUNDLE`` renders the charts later, elsewhere.
    """
    d = from_bundle(bundle, display_path)
    try:
        return render(d)
    except MemoryError:
        d.notes.insert(0, "Charts are left out: memory was exhausted when this report was "
                          "written. `memwatch report BUNDLE -o report.html` renders them.")
        return render(d, with_charts=False)


def render_run(mw: MemWatch, path: str | os.PathLike[str]) -> Path:
    """Write the report of a live (or closed) run to ``path``; returns the absolute path."""
    return write_html(render(from_run(mw)), path)


def render_export(src: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Write the report of a JSONL/CSV export ``src`` to ``path``; returns the absolute path."""
    return write_html(render(from_export(src)), path)
