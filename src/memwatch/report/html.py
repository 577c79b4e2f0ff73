"""A self-contained HTML report of one bundle: one file, no script, no network.

Training clusters are often air-gapped, so the page carries its own CSS and draws its chart as
inline SVG. (The full report with a plotting library is a later step; this one must already open
offline and say what ran out, how full memory was, what held it and what the findings were.)

Example::

    >>> from memwatch.bundle import open_bundle
    >>> from memwatch.report.html import render_bundle_html
    >>> html = render_bundle_html(open_bundle(path))      # doctest: +SKIP
"""

from __future__ import annotations

import html as _html
import math
from typing import Any

from memwatch.bundle import Bundle
from memwatch.report.summary import (
    SHOWN_METRICS,
    Summary,
    latest_findings,
    summarize,
    tensor_label,
)
from memwatch.units import fmt_bytes

__all__ = ["render_bundle_html", "render_summary_html"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.6em}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eee;padding:.25em .5em;
text-align:left;vertical-align:top}th{background:#f6f6f6}td.n{text-align:right;
font-variant-numeric:tabular-nums}
.headline{font-size:1.2em;background:#fff4f4;border-left:4px solid #d62728;padding:.6em 1em}
.bar{background:#eee;width:200px;height:12px;display:inline-block;vertical-align:middle}
.bar>span{display:block;height:12px}
pre{background:#f6f6f6;padding:.8em;overflow:auto;max-height:28em;font-size:12px}
.sev-critical{color:#b00020;font-weight:600}.sev-warning{color:#a65f00}.muted{color:#777}
svg text{font:11px sans-serif;fill:#444}
"""


def _e(x: Any) -> str:
    return _html.escape(str(x), quote=True)


def _chart(s: Summary, width: int = 1000, height: int = 260) -> str:
    keys = [k for k in SHOWN_METRICS if k in s.keys]
    pts = [r for r in s.samples if isinstance(r.get("step"), (int, float))]
    if not keys or len(pts) < 2:
        return '<p class="muted">No timeline samples recorded.</p>'
    vals = [v for r in pts for k in keys
            if isinstance(v := r.get(k), (int, float)) and math.isfinite(v)]
    if not vals:
        return '<p class="muted">No timeline values recorded.</p>'
    x0, x1 = float(pts[0]["step"]), float(pts[-1]["step"])
    ymax = max(vals) * 1.05 or 1.0
    ml, mr, mt, mb = 70, 10, 10, 30
    pw, ph = width - ml - mr, height - mt - mb

    def sx(x: float) -> float:
        return ml + (x - x0) / ((x1 - x0) or 1.0) * pw

    def sy(y: float) -> float:
        return mt + ph - y / ymax * ph

    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
             'aria-label="memory over steps">',
             f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fcfcfc" stroke="#ddd"/>']
    for i in range(5):
        y = ymax * i / 4
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{ml - 5}" y="{sy(y) + 4:.1f}" text-anchor="end">'
                     f'{_e(fmt_bytes(y))}</text>')
    for ep in s.epochs:
        st = ep.get("end_step")
        if isinstance(st, (int, float)) and x0 <= st <= x1:
            parts.append(f'<line x1="{sx(st):.1f}" x2="{sx(st):.1f}" y1="{mt}" y2="{mt + ph}" '
                         'stroke="#bbb" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{ml}" y="{height - 8}">step {int(x0)}</text>')
    parts.append(f'<text x="{ml + pw}" y="{height - 8}" text-anchor="end">step {int(x1)}</text>')
    legend = []
    for i, k in enumerate(keys):
        color = _COLORS[i % len(_COLORS)]
        coords = " ".join(f"{sx(float(r['step'])):.1f},{sy(float(v)):.1f}" for r in pts
                          if isinstance(v := r.get(k), (int, float)) and math.isfinite(v))
        if coords:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{coords}"/>')
            legend.append(f'<span style="color:{color}">&#9632; {_e(k)}</span>')
    parts.append("</svg>")
    return "".join(parts) + "<p>" + " &nbsp; ".join(legend) + "</p>"


def render_summary_html(s: Summary) -> str:
    m = s.manifest
    cls = m.get("classification")
    kind = cls.get("kind") if isinstance(cls, dict) else cls
    h: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memwatch bundle {_e(m.get('name', ''))}</title><style>{_CSS}</style></head><body>",
        f"<h1>memwatch bundle <code>{_e(m.get('name', ''))}</code></h1>",
        f"<p class='muted'>Written {_e(m.get('created_utc', '?'))} on {_e(m.get('host', '?'))}, "
        f"rank {_e(m.get('rank', '?'))}, pid {_e(m.get('pid', '?'))}; trigger "
        f"<b>{_e(m.get('trigger', '?'))}</b>, class <b>{_e(kind or '-')}</b>"
        f"{', captured before the stack unwound' if m.get('pre_unwind') else ''}.</p>",
        f"<p class='headline'>{_e(s.headline)}</p>",
    ]
    if s.exception:
        h.append(f"<h2>Exception</h2><p><b>{_e(s.exception.get('type', ''))}</b></p>"
                 f"<pre>{_e(s.exception.get('message', ''))}</pre>")
    h.append("<h2>How full memory was</h2>")
    if s.fullness:
        h.append("<table><tr><th>metric</th><th>value</th><th>limit</th><th>used</th></tr>")
        for r in s.fullness:
            u = r["utilization"]
            color = "#d62728" if u >= 0.95 else "#ff7f0e" if u >= 0.85 else "#2ca02c"
            h.append(f"<tr><td>{_e(r['metric'])}</td><td class='n'>{_e(fmt_bytes(r['value']))}"
                     f"</td><td class='n'>{_e(fmt_bytes(r['limit']))}</td><td><span class='bar'>"
                     f"<span style='width:{min(u, 1) * 100:.0f}%;background:{color}'></span>"
                     f"</span> {u * 100:.1f}%</td></tr>")
        h.append("</table>")
    else:
        h.append("<p class='muted'>No known limit for the recorded metrics.</p>")
    h.append("<h2>Memory over steps</h2>" + _chart(s))
    h.append("<h2>Largest live tensors</h2>")
    if s.top_tensors:
        h.append("<table><tr><th>bytes</th><th>count</th><th>tensor</th><th>held by</th></tr>")
        for t in s.top_tensors[:20]:
            h.append(f"<tr><td class='n'>{_e(fmt_bytes(t.get('bytes')))}</td><td class='n'>"
                     f"{_e(t.get('count', ''))}</td><td>{_e(tensor_label(t))}</td><td>"
                     f"{_e(t.get('holder') or '')}</td></tr>")
        h.append("</table>")
    else:
        h.append(f"<p class='muted'>{_e(s.census_note or 'No census recorded.')}</p>")
    latest = latest_findings(s.findings)
    h.append(f"<h2>Findings ({len(s.findings)})</h2>")
    if len(latest) < len(s.findings):
        h.append("<p class='muted'>The analyzer restates a verdict at every epoch end; the "
                 "latest of each kind and metric is shown.</p>")
    if latest:
        h.append("<table><tr><th>severity</th><th>kind</th><th>metric</th><th>verdict</th>"
                 "<th>culprit</th><th>suggestions</th></tr>")
        for f in latest:
            sev = str(f.get("severity", ""))
            sugg = "<br>".join(_e(x) for x in f.get("suggestions") or [])
            h.append(f"<tr><td class='sev-{_e(sev)}'>{_e(sev)}</td><td>{_e(f.get('kind', ''))}"
                     f"</td><td>{_e(f.get('metric', ''))}</td><td>{_e(f.get('message', ''))}</td>"
                     f"<td>{_e(f.get('culprit') or '')}</td><td>{sugg}</td></tr>")
        h.append("</table>")
    else:
        h.append("<p class='muted'>No findings before the failure.</p>")
    if s.allocator:
        stats = s.allocator.get("memory_stats") or {}
        h.append("<h2>Allocator at the failure</h2>")
        seg = s.allocator.get("segments_summary")
        if isinstance(seg, dict):
            h.append("<p>" + ", ".join(f"{_e(k)}: <b>{_e(fmt_bytes(v) if 'bytes' in k else v)}"
                                       "</b>" for k, v in seg.items()
                                       if not isinstance(v, (list, dict))) + "</p>")
        h.append("<table><tr><th>statistic</th><th>value</th></tr>")
        for k in sorted(stats)[:200]:
            v = stats[k]
            shown = fmt_bytes(v) if "bytes" in k and isinstance(v, (int, float)) else v
            h.append(f"<tr><td>{_e(k)}</td><td class='n'>{_e(shown)}</td></tr>")
        h.append("</table>")
    if s.exception and s.exception.get("traceback"):
        h.append(f"<h2>Traceback</h2><pre>{_e(s.exception['traceback'])}</pre>")
    h.append("<h2>Environment</h2><table>")
    for k in ("python", "platform", "torch", "torch_cuda", "device", "rank", "argv", "env"):
        if k in s.environment:
            v = s.environment[k]
            if isinstance(v, dict):
                v = ", ".join(f"{a}={b}" for a, b in v.items())
            elif isinstance(v, list):
                v = " ".join(str(x) for x in v)
            h.append(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>")
    h.append("</table>")
    files = m.get("files") or {}
    h.append("<h2>Files</h2><table>" + "".join(
        f"<tr><td>{_e(f)}</td><td class='n'>{_e(fmt_bytes(b))}</td></tr>"
        for f, b in files.items()) + "</table>")
    h.append("<p class='muted'>Generated by memwatch. Inspect in a terminal with "
             f"<code>memwatch inspect {_e(s.path)}</code>.</p></body></html>\n")
    return "\n".join(h)


def render_bundle_html(bundle: Bundle, display_path: str | None = None) -> str:
    """The report of ``bundle`` as one HTML string (raises BundleError on corrupted files)."""
    s = summarize(bundle)
    if display_path is not None:
        s.path = display_path
    return render_summary_html(s)
