"""The report's first screen: what happened, the verdicts as cards, and the chart that shows them.

Everything a person opened the report for fits in a 1400×900 window: for a bundle what ran out
(and the limit that was fullest), then one card per verdict (:mod:`memwatch.report.verdicts`:
kind and severity, holder, growth with its interval, forecast, fix, evidence), then one chart of
the worst verdict's metric with its floors, trend, checks and limit. A run without a verdict says
so in one line with its peaks. The rest of the report follows, collapsed.
"""

from __future__ import annotations

from memwatch.core.units import fmt_bytes
from memwatch.report import charts
from memwatch.report.page import Page, esc, rich
from memwatch.report.summary import SHOWN_METRICS
from memwatch.report.text import shorten
from memwatch.report.verdicts import Card, cards, clean_line

__all__ = ["header", "hero", "verdicts"]

#: Fuller than this at a failure, a limit is named under the headline.
FULL_SHARE = 0.9


def header(p: Page) -> None:
    d = p.d
    p.add(f"<h1>{esc(d.title)}</h1>")
    p.add("<p class='meta'>" + " · ".join(
        f"{esc(k)} <b>{esc(v)}</b>" for k, v in d.meta) + "</p>")
    lines = []
    if d.headline:
        lines.append(f"<b>{esc(d.headline)}</b>")
    if d.exception and (d.exception.get("type") or d.exception.get("message")):
        msg = shorten(d.exception.get("message") or "", 240)
        lines.append(f"<span class='exc'>{esc(d.exception.get('type') or '')}: {esc(msg)}</span>")
    full = max(d.fullness, key=lambda r: float(r["utilization"]), default=None)
    if d.source == "bundle" and full is not None and float(full["utilization"]) >= FULL_SHARE:
        lines.append(f"Fullest at the failure: {esc(full['metric'])}, "
                     f"{esc(fmt_bytes(full['value']))} of {esc(fmt_bytes(full['limit']))} "
                     f"({float(full['utilization']):.1%}).")
    if lines:
        p.add("<p class='headline'>" + "<br>".join(lines) + "</p>")


def _card(c: Card, i: int) -> str:
    rows: list[tuple[str, str]] = []
    if c.holder:
        rest = f" <span class='muted'>{esc(c.holder_detail)}</span>" if c.holder_detail else ""
        rows.append(("Held by", f"<b class='holder'>{esc(c.holder)}</b>{rest}"))
    elif c.kind in ("leak", "rank_leak"):
        rows.append(("Held by", "<span class='muted'>not named (the evidence says why)</span>"))
    if c.rate:
        rows.append(("Growth", esc(c.rate)))
    if c.forecast:
        rows.append(("Forecast", esc(c.forecast)))
    if c.history:
        rows.append(("History", esc(c.history)))
    if c.fix:
        more = ("<ul>" + "".join(f"<li>{rich(t)}</li>" for t in c.more_fixes) + "</ul>"
                if c.more_fixes else "")
        rows.append(("Fix", f"<b class='fix'>{rich(c.fix)}</b>{more}"))
    chips = "".join(
        f"<span class='ev {'yes' if e.found else 'no'}' title='{esc(e.detail)}'>"
        f"{'✓' if e.found else '–'} {esc(e.name)}: {esc(e.detail)}</span>" for e in c.evidence)
    rows.append(("Evidence", chips))
    grid = "".join(f"<div class='k'>{k}</div><div class='v'>{v}</div>" for k, v in rows)
    state = str((c.finding.get("evidence") or {}).get("belief_state") or "")
    what = "leak, stopped" if state == "stopped" else c.kind.replace("_", " ")
    return (f"<article class='card {esc(c.severity)}' id='mw-card-{i}'><div class='head'>"
            f"<span class='badge {esc(c.severity)}'>{esc(c.severity)}</span> "
            f"<b>{esc(what)}</b> in <code>{esc(c.metric)}</code> "
            f"<span class='muted'>judged at {esc(c.when or 'the last check')}</span></div>"
            f"<div class='grid'>{grid}</div><details class='words'><summary>The analyzer's "
            f"words</summary><p>{rich(c.message)}</p></details></article>")


def verdicts(p: Page) -> None:
    cs = cards(p.d)
    if not cs:
        p.add(f"<p class='clean'>{esc(clean_line(p.d))}</p>")
        return
    for i, c in enumerate(cs):
        p.add(_card(c, i))


def _hero_metric(p: Page) -> str | None:
    d = p.d
    for c in cards(d):
        if any(v is not None for v in d.values.get(c.metric) or []):
            return c.metric
    return next((m for m in SHOWN_METRICS if any(d.values.get(m) or [])), None)


def hero(p: Page) -> None:
    d = p.d
    metric = _hero_metric(p)
    got = charts.memory_chart(d, metric, hero=True) if metric else None
    if metric is None or got is None:
        return
    fig, trend = got
    p.shown.add(metric)
    vals = [v for v in d.values[metric] if v is not None]
    cap = (f"<code>{esc(metric)}</code>: samples (blue; a window of many is drawn as its "
           "maximum) above their floor, the memory still held (green), the trend of the memory "
           "held (dashed red) and its forecast to the limit (dotted), the checks (◆: hover for "
           f"what each judged). Last {esc(fmt_bytes(vals[-1]))}, peak "
           f"{esc(fmt_bytes(max(vals)))}")
    if trend is not None and trend.significant:
        cap += f"; trend {esc(trend.describe())}"
    limit = d.limits.get(metric)
    if limit:
        drawn = any(s.get("xref") == "paper" for s in fig["layout"]["shapes"])  # the limit
        where = "the red dashed line" if drawn else "too far above to draw"
        if trend is not None and trend.significant and trend.limit_step is not None:
            cap += f" (the peak is {max(vals) / limit:.1%} of it; {where})"
        else:
            cap += (f"; limit {esc(fmt_bytes(limit))} ({max(vals) / limit:.1%} at the peak, "
                    f"{where})")
    p.chart(fig, cap + ".")
