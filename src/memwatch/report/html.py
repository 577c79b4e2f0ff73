"""A self-contained HTML report: one file that opens offline, with interactive charts.

Training clusters are often air-gapped, so the page carries everything: its CSS, its data and
plotly.js itself, inlined from the ``plotly`` package (``pip install 'memwatch[report]'``; without
it the report still renders, with tables and a note in place of charts). It loads nothing from the
network. Three sources render the same way (see :mod:`memwatch.report.data`):

* a live run: :func:`render_run` (``render_run(mw, "report.html")``);
* an OOM bundle: :func:`render_bundle_html` / ``memwatch report BUNDLE -o report.html`` (and every
  bundle's own ``report.html``);
* a JSONL or CSV export of samples: :func:`render_export` / ``memwatch report run.jsonl``.

The first screen answers what the reader came for (:mod:`memwatch.report.first_screen`): what ran
out, one card per verdict (kind and severity, holder, growth with its interval, forecast, fix,
evidence) and the chart of the worst one (series, floors, trend, checks, limit); a clean run says
so in one line with its peaks. Below, collapsed (``<details>``, charts drawn when opened): the
other metrics over steps, every finding, the largest live tensors, how full memory was, DataLoader
workers (USS vs RSS), and for a bundle the allocator at the failure and, with allocation history,
an allocation timeline and the largest allocations by stack. A section whose data is missing says
so; a section that fails to render becomes a note. The report is never the reason a run or a
bundle fails.

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

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwatch.core.jsonable import finite
from memwatch.report import charts
from memwatch.report._sections import SECTIONS
from memwatch.report.data import ReportData, from_bundle, from_run
from memwatch.report.exports import from_export
from memwatch.report.page import Page
from memwatch.report.page import esc as _e

if TYPE_CHECKING:
    from memwatch.bundle import Bundle
    from memwatch.core.protocols import LiveRun

__all__ = ["render", "render_bundle_html", "render_export", "render_run", "write_html"]

INSTALL_HINT = "pip install 'memwatch[report]'"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1em auto;
max-width:1240px;color:#222;padding:0 1em}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.1em;margin:1.2em 0 .4em}h3{font-size:1em;
margin:1em 0 .3em}.meta{color:#666;font-size:12.5px;margin:.1em 0 .6em;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;margin:.4em 0}td,th{border-bottom:1px solid #eee;
padding:.25em .5em;text-align:left;vertical-align:top}th{background:#f6f6f6;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.headline{background:#fff4f4;border-left:4px solid #d62728;padding:.5em 1em;margin:.4em 0}
.exc{font:12.5px ui-monospace,monospace;color:#444}
.clean{background:#f1f8f1;border-left:4px solid #2ca02c;padding:.6em 1em;font-size:1.05em}
.card{border:1px solid #ddd;border-left:5px solid #999;border-radius:3px;padding:.5em 1em;
margin:.5em 0}.card.critical{border-left-color:#b00020}.card.warning{border-left-color:#e69500}
.card.info{border-left-color:#1f77b4}.card .head{font-size:1.1em;margin-bottom:.3em}
.badge{color:#fff;background:#777;border-radius:3px;padding:0 .45em;font-size:.8em;
text-transform:uppercase;vertical-align:middle}.badge.critical{background:#b00020}
.badge.warning{background:#c77700}.badge.info{background:#1f77b4}
.grid{display:grid;grid-template-columns:6.5em 1fr;gap:.15em .8em}.grid .k{color:#666}
.grid ul{margin:.1em 0 0 1.1em;padding:0;font-size:.93em}.holder{font-size:1.05em}
.ev{display:inline-block;margin:0 .4em .15em 0;padding:0 .4em;border-radius:3px;
font-size:12.5px}.ev.yes{background:#e8f4e8}.ev.no{background:#f3f3f3;color:#666}
.words{font-size:12.5px;color:#555}.words p{margin:.2em 0}
details{border-top:1px solid #e4e4e4;padding:.35em 0}details>summary{cursor:pointer;
font-weight:600}details[open]>summary{margin-bottom:.4em}
.bar{background:#eee;width:200px;height:12px;display:inline-block;vertical-align:middle}
.bar>span{display:block;height:12px}
pre{background:#f6f6f6;padding:.8em;overflow:auto;max-height:28em;font-size:12px;
white-space:pre-wrap;word-break:break-word}
.sev-critical{color:#b00020;font-weight:700}.sev-warning{color:#a65f00;font-weight:600}
.sev-info{color:#2a6f2a}.muted{color:#777;font-weight:400}
.chart{min-height:300px;border:1px solid #eee;margin:.4em 0 .2em}
.caption{font-size:12.5px;color:#555;margin:0 0 .8em}
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

# A chart is drawn when it can be seen: at load on the first screen, and inside a collapsed
# <details> when it (and every <details> around it) is opened. Plotly sizes a chart from its
# container, which has no width while collapsed. What several charts share comes once, in
# "refs" (copied for each chart: plotly writes into the objects it is given).
_DRAW = """
(function(){
var doc=JSON.parse(document.getElementById('mw-figures').textContent);
var ok=0;
function report(){document.body.setAttribute('data-charts-rendered',String(ok));
  var p=document.getElementById('mw-errors');if(p){p.textContent=window.__mwErrors.join('\\n');}}
function deref(v){return v&&v.ref!==undefined?JSON.parse(JSON.stringify(doc.refs[v.ref])):v;}
function draw(f,el){
  if(el.getAttribute('data-rendered'))return;
  var data=f.data.map(function(t){t.x=deref(t.x);return t;});
  f.layout.shapes=deref(f.layout.shapes);f.layout.annotations=deref(f.layout.annotations);
  try{Plotly.newPlot(el,data,f.layout,{displaylogo:false,responsive:true});
      el.setAttribute('data-rendered','1');ok++;}
  catch(err){window.__mwErrors.push(f.id+': '+err);
      el.textContent='This chart could not be drawn: '+err;}
  report();
}
doc.figs.forEach(function(f){
  var el=document.getElementById(f.id),boxes=[],n=el.parentElement;
  for(;n;n=n.parentElement){if(n.tagName==='DETAILS'){boxes.push(n);}}
  function maybe(){if(boxes.every(function(b){return b.open;})){draw(f,el);}}
  boxes.forEach(function(b){b.addEventListener('toggle',maybe);});
  maybe();
});
document.body.setAttribute('data-charts-total',String(doc.figs.length));
report();
})();
"""


def _shared(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"refs", "figs"}``: what several charts repeat (each memory chart has the same steps and
    the same epoch-end marks) stored once, as ``{"ref": i}`` where it was."""
    seen: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for fig in figures:
        places = [(t, "x") for t in fig.get("data", [])]
        places += [(fig.get("layout", {}), "shapes"), (fig.get("layout", {}), "annotations")]
        for obj, key in places:
            v = obj.get(key)
            if isinstance(v, list) and len(v) >= (16 if key == "x" else 1):
                seen.setdefault(json.dumps(v, separators=(",", ":")), []).append((obj, key))
    refs: list[Any] = []
    for where in seen.values():
        if len(where) > 1:
            refs.append(where[0][0][where[0][1]])
            for obj, key in where:
                obj[key] = {"ref": len(refs) - 1}
    return {"refs": refs, "figs": figures}


def _json_for_script(obj: Any) -> str:
    # "<" escaped so that no "</script>" inside the data can end the script element.
    return json.dumps(finite(obj), separators=(",", ":"), allow_nan=False).replace(
        "<", "\\u003c")


# --------------------------------------------------------------------------- assembly
def render(d: ReportData, plotly: str | None = None, with_charts: bool = True,
           sections: Sequence[tuple[str, Callable[[Page], None]]] = SECTIONS) -> str:
    """The report of ``d`` as one HTML document (never raises for missing data).

    ``plotly`` is the plotly.js text to inline; by default the ``plotly`` package's own copy.
    Without it (or with ``with_charts=False``) the charts are left out and the page says so.
    ``sections``: what the page shows, in order (a job's report has its own:
    :mod:`memwatch.report.job_report`).
    """
    js = None
    if with_charts:
        js = plotly if plotly is not None else charts.plotly_js()
    p = Page(d, with_charts=js is not None)
    for name, fn in sections:
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
                   f"{_json_for_script(_shared(p.figures))}</script><script>{_DRAW}</script>")
    return "\n".join([head, *p.parts, notes, foot, "<pre id='mw-errors'></pre>", scripts,
                      "</body></html>\n"])


def write_html(html: str, path: str | os.PathLike[str]) -> Path:
    """Write ``html`` to ``path`` atomically (a reader never sees half a report)."""
    out = Path(os.path.abspath(path))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    except OSError as e:  # name the file asked for, not the temporary one
        raise OSError(e.errno, e.strerror, str(out)) from None
    try:
        # A lone surrogate (a file name that is not UTF-8) is written as "?", never raised.
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(html)
        os.replace(tmp, out)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(out)) from None
        raise
    return out


def render_bundle_html(bundle: Bundle, display_path: str | None = None,
                       with_charts: bool = True) -> str:
    """The report of ``bundle`` as one HTML string (raises BundleError on corrupted files).

    Written by the flight recorder at the failure, when memory may be exhausted: if the page with
    its 5 MB of inlined plotly.js does not fit, the tables alone are rendered (a few KiB), and
    ``memwatch report BUNDLE`` renders the charts later, elsewhere. ``with_charts=False`` renders
    the tables alone on purpose (``bundle_report="tables"``).
    """
    d = from_bundle(bundle, display_path)
    if not with_charts:
        d.notes.insert(0, "Charts are left out to keep this bundle small (bundle_report): "
                          "`memwatch report BUNDLE -o report.html` renders them.")
        return render(d, with_charts=False)
    try:
        return render(d)
    except MemoryError:
        d.notes.insert(0, "Charts are left out: memory was exhausted when this report was "
                          "written. `memwatch report BUNDLE -o report.html` renders them.")
        return render(d, with_charts=False)


def render_run(mw: LiveRun, path: str | os.PathLike[str]) -> Path:
    """Write the report of a live (or closed) run to ``path``; returns the absolute path."""
    return write_html(render(from_run(mw)), path)


def render_export(src: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Write the report of a JSONL/CSV export ``src`` to ``path``; returns the absolute path."""
    return write_html(render(from_export(src)), path)
