"""The sections of the HTML report, in page order: the first screen
(:mod:`memwatch.report.first_screen`), then everything else, each section collapsed in a
``<details>`` whose charts are drawn when it is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memwatch.core.units import fmt_bytes
from memwatch.report import charts
from memwatch.report.allocator import history_view, segments_view
from memwatch.report.data import CHART_METRICS, epochs_in
from memwatch.report.first_screen import header, hero, verdicts
from memwatch.report.page import Page, rich
from memwatch.report.page import esc as _e
from memwatch.report.summary import latest_findings, tensor_label

__all__ = ["SECTIONS"]


# --------------------------------------------------------------------------- sections
def _severity_rank(f: dict[str, Any]) -> int:
    return {"critical": 0, "warning": 1, "info": 2}.get(str(f.get("severity")), 3)


def _memory(p: Page) -> None:
    d = p.d
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
    metrics = [m for m in metrics if m not in p.shown]  # the first screen drew those
    if not metrics:
        return
    p.details("memory", f"Memory over steps: {len(metrics)} more metric(s) "
                        f"<span class='muted'>({_e(', '.join(metrics))})</span>")
    epochs = epochs_in(d)
    p.add("<p class='caption'>One chart per metric (raw samples"
          + ("; dotted vertical lines are epoch ends" if epochs else "")
          + "). The dashed red line is the trend of the memory <i>held</i> (the floors"
          + (" after the first epoch" if epochs else "")
          + ", or the analyzer's rate when it gave a verdict), dotted where it is extrapolated "
          "to the limit.</p>")
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
    p.end_details()


def _fullness(p: Page) -> None:
    d = p.d
    if not d.fullness:
        return
    top = max(d.fullness, key=lambda r: float(r["utilization"]))
    p.details("fullness", f"How full memory was <span class='muted'>(fullest: "
                          f"{_e(top['metric'])}, {float(top['utilization']):.1%})</span>")
    p.add("<table><tr><th>metric</th><th>value</th><th>limit</th><th>used</th></tr>")
    for r in d.fullness:
        u = float(r["utilization"])
        color = "#d62728" if u >= 0.95 else "#ff7f0e" if u >= 0.85 else "#2ca02c"
        p.add(f"<tr><td>{_e(r['metric'])}</td><td class='n'>{_e(fmt_bytes(r['value']))}</td>"
              f"<td class='n'>{_e(fmt_bytes(r['limit']))}</td><td><span class='bar'><span "
              f"style='width:{min(u, 1) * 100:.0f}%;background:{color}'></span></span> "
              f"{u * 100:.1f}%</td></tr>")
    p.add("</table>")
    p.end_details()


def _workers(p: Page) -> None:
    d = p.d
    fig = charts.workers_chart(d)
    if fig is None:
        return
    p.details("workers", "DataLoader workers <span class='muted'>(" + (
        f"{len(d.workers)} worker(s)" if d.workers else "summed over the workers") + ")</span>")
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
    p.end_details()


def _findings(p: Page) -> None:
    d = p.d
    latest = sorted(latest_findings(d.findings), key=_severity_rank)
    p.details("findings", "Findings, every kind and metric " + (
        f"({len(latest)} latest of {len(d.findings)})" if d.findings else "(none)"))
    if len(latest) < len(d.findings):
        p.add("<p class='muted'>The analyzer restates a verdict at every check; the latest "
              "of each kind and metric is shown.</p>")
    if not latest:
        p.add("<p class='muted'>No findings.</p>")
    for f in latest:
        sev = str(f.get("severity", ""))
        figures = []
        if f.get("bytes_per_step"):
            figures.append(f"{fmt_bytes(f['bytes_per_step'])}/step")
        if f.get("steps_to_oom"):
            figures.append(f"OOM in ~{int(f['steps_to_oom']):,} steps")
        if f.get("seconds_to_oom"):
            figures.append(f"~{float(f['seconds_to_oom']) / 60:.0f} min")
        if f.get("epoch") is not None and epochs_in(d):
            figures.append(f"epoch {f['epoch']}")
        elif isinstance(f.get("step"), int):
            figures.append(f"step {f['step']:,}")
        p.add(f"<div class='finding {_e(sev)}'><b class='sev-{_e(sev)}'>{_e(sev)}</b> "
              f"<b>{_e(f.get('kind', ''))}</b> on <code>{_e(f.get('metric', ''))}</code> "
              f"<span class='muted'>{_e(' · '.join(figures))}</span>"
              f"<div>{rich(f.get('message', ''))}</div>")
        if f.get("culprit"):
            p.add(f"<div><b>Culprit:</b> {_e(f['culprit'])}</div>")
        tips = [t for t in f.get("suggestions") or [] if t]
        if tips:
            p.add("<b>Try:</b><ul>" + "".join(f"<li>{rich(t)}</li>" for t in tips) + "</ul>")
        p.add("</div>")
    p.end_details()


def _tensors(p: Page) -> None:
    d = p.d
    if d.source != "bundle" and not d.top_tensors:
        return
    p.details("tensors", f"Largest live tensors <span class='muted'>({len(d.top_tensors)} "
                         "group(s) in the census)</span>")
    if d.killer:  # what held the memory that grew since the last check
        p.add(f"<p><b>What grew since the last check:</b> {_e(d.killer[0])}</p><ul>"
              + "".join(f"<li>{_e(ln)}</li>" for ln in d.killer[1:]) + "</ul>")
    if not d.top_tensors:
        p.add(f"<p class='muted'>{_e(d.census_note or 'No census recorded.')}</p>")
        p.end_details()
        return
    p.add("<table><tr><th>bytes</th><th>count</th><th>tensor</th><th>held by</th></tr>")
    for t in d.top_tensors[:20]:
        p.add(f"<tr><td class='n'>{_e(fmt_bytes(t.get('bytes')))}</td><td class='n'>"
              f"{_e(t.get('count', ''))}</td><td>{_e(tensor_label(t))}</td><td>"
              f"{_e(t.get('holder') or '')}</td></tr>")
    p.add("</table>")
    p.end_details()


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


def _allocator(p: Page) -> None:
    d = p.d
    request = None
    if d.exception:
        request = (d.exception.get("numbers") or {}).get("tried_to_allocate")
    view = segments_view(d.snapshot, request if isinstance(request, int) else None)
    stats = (d.allocator_stats or {}).get("memory_stats") if d.allocator_stats else None
    if view is None and not stats:
        if d.source == "bundle":
            p.details("allocator", "Allocator at the failure <span class='muted'>(none: a "
                                   "host-only run has no device allocator)</span>")
            p.add("<p class='muted'>No allocator snapshot or statistics in this bundle.</p>")
            p.end_details()
        return
    p.details("allocator", "Allocator at the failure" if d.source == "bundle" else
              "Allocator now")
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
    p.end_details()


def _history(p: Page) -> None:
    d = p.d
    hist = history_view(d.snapshot)
    if hist is None:
        if d.snapshot is not None:
            p.add("<p class='muted'>No allocation history in the snapshot: run with "
                  "<code>MemWatch(record_history=True)</code> to see who allocated what "
                  "(see docs/troubleshooting.md for its cost).</p>")
        return
    p.details("history", f"Allocation history <span class='muted'>({hist['events']:,} "
                         "allocator events)</span>")
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
    p.end_details()


def _details(p: Page) -> None:
    d = p.d
    if d.exception and (d.exception.get("traceback") or d.exception.get("message")):
        p.details("traceback", f"Exception and traceback <span class='muted'>"
                               f"({_e(d.exception.get('type') or '')})</span>")
        p.add(f"<pre>{_e(d.exception.get('message') or '')}</pre>")
        if d.exception.get("traceback"):
            p.add("<pre>" + _e(d.exception["traceback"]) + "</pre>")
        p.end_details()
    if d.environment:
        p.details("environment", "Environment")
        p.add("<table>")
        for k in ("python", "platform", "torch", "torch_cuda", "device", "rank", "argv", "env"):
            if k in d.environment:
                v = d.environment[k]
                if isinstance(v, dict):
                    v = ", ".join(f"{a}={b}" for a, b in v.items())
                elif isinstance(v, list):
                    v = " ".join(str(x) for x in v)
                p.add(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>")
        p.add("</table>")
        p.end_details()
    if d.files:
        p.details("files", f"Files of the bundle <span class='muted'>({len(d.files)})</span>")
        p.add("<table>" + "".join(
            f"<tr><td>{_e(f)}</td><td class='n'>{_e(fmt_bytes(b))}</td></tr>"
            for f, b in d.files.items()) + "</table>")
        p.end_details()


#: The sections, in page order: (name, renderer).
SECTIONS: tuple[tuple[str, Callable[[Page], None]], ...] = (
    ("header", header), ("verdicts", verdicts), ("chart", hero),
    ("memory", _memory), ("findings", _findings), ("tensors", _tensors),
    ("fullness", _fullness), ("workers", _workers), ("allocator", _allocator),
    ("history", _history), ("details", _details),
)
