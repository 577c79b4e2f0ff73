"""One HTML report for a whole distributed job: ``memwatch report DIR [DIR...]`` of its out_dirs.

The verdict comes first: which rank failed first, on which host, when and of what, and what the
other ranks were doing (a collective that lost it: ``peer_failure``; stopped by the launcher;
no bundle). Then the job's verdicts as cards: rank 0's cross-rank verdicts (``rank_leak`` naming
the rank, its node and its holder; ``rank_near_oom``; ``rank_unresponsive``), as its bundle
recorded them, and each rank's own leak and near-OOM verdicts. Below: every rank's memory at the
moment of the first failure (:func:`memwatch.report.jobs.compare`), every rank's series on one
time axis (seconds from the first failure; a rank without a bundle is drawn from rank 0's
``ranks.json``, its peak at the last exchange), each rank's findings, rank 0's last exchange,
and the bundles read. Each bundle keeps its own report (``memwatch report BUNDLE``).

Example::

    >>> from memwatch.report.job_report import MAX_RANK_LINES
    >>> MAX_RANK_LINES
    16
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

from memwatch.core.errors import BundleError
from memwatch.core.units import fmt_bytes
from memwatch.report import charts
from memwatch.report.data import ReportData, finite
from memwatch.report.first_screen import header, verdicts
from memwatch.report.html import render
from memwatch.report.jobs import Job, JobComparison, RankAtFailure, compare, when
from memwatch.report.page import Page, esc
from memwatch.report.summary import latest_findings
from memwatch.report.text import shorten

__all__ = ["MAX_RANK_LINES", "job_data", "render_job_html"]

#: Ranks drawn per chart, at most: the first to fail, then the highest at their peak.
MAX_RANK_LINES = 16
#: Points per rank and chart, at most (each window of samples drawn as its maximum).
MAX_POINTS = 600
_VERDICT_KINDS = ("leak", "near_oom", "fragmentation", "rank_leak", "rank_near_oom",
                  "rank_unresponsive", "rank_imbalance")


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _read(c: JobComparison, r: RankAtFailure, name: str) -> Any:
    b = next((x.bundle for x in c.job.bundles if x.path == r.path), None)
    if b is None:
        return None
    try:
        return b.read_json(name) if name != "timeline" else \
            [s for s in b.timeline() if s.get("type") == "sample"]
    except BundleError:
        return None


def _findings(c: JobComparison) -> list[dict[str, Any]]:
    """The job's verdicts: every rank's latest of each kind and metric (rank 0's cross-rank
    ones included), each with its rank."""
    out: list[dict[str, Any]] = []
    for r in c.ranks:
        fs = _read(c, r, "findings.json") if r.path is not None else r.findings
        for f in latest_findings([f for f in fs or [] if isinstance(f, dict)]):
            if f.get("kind") in _VERDICT_KINDS:
                out.append({**f, "rank": f.get("rank") if f.get("rank") is not None else r.rank})
    return out


def job_data(c: JobComparison, where: str = "") -> ReportData:
    """The first screen of a job's report: title, facts, headline and the verdicts."""
    job, f = c.job, c.first
    m = f.bundle.manifest
    several = len(job.hosts) > 1
    on = f" on {f.host}" if several or f.host else ""
    lead = (f"Rank {f.rank}{on} failed first" if f.is_own_failure or not f.is_failure else
            f"No rank's own failure was recorded; first: rank {f.rank}{on}'s collective lost a "
            "peer")
    try:
        exc = f.bundle.read_json("exception.json")
    except BundleError:
        exc = None
    return ReportData(
        title=f"memwatch job {job.label}", source="job",
        meta=[("world size", str(job.world_size)),
              ("bundles from rank(s)", ", ".join(map(str, job.ranks))),
              ("hosts", ", ".join(job.hosts)), ("job id from", job.source or "the bundles"),
              ("read from", where or "-")],
        headline=f"{lead}, at {_utc(f.time)} ({when(m)}): {c.headline}",
        exception=exc if isinstance(exc, dict) else None, findings=_findings(c),
        cli_hint=f"memwatch inspect {where}" if where else None)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table: ``head`` as HTML, each row's cells as HTML (escape what is text)."""
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>")


def _story(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        for n in c.notes:
            p.add(f"<p class='note'>{esc(n)}</p>")
    return section


def _cell(s: dict[str, Any] | None, metric: str, limits: dict[str, float]) -> str:
    v = finite(s.get(metric)) if s is not None else None
    if v is None:
        return "-"
    lim = limits.get(metric)
    return fmt_bytes(v) + (f" ({v / lim:.0%})" if lim else "")


def _ranks_table(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        p.add(f"<h2>Every rank at {esc(_utc(c.first.time))}</h2><p class='caption'>The last "
              "sample at or before the first failure in each rank's own bundle (percentages "
              "of the rank's limit); a rank without a bundle: its peaks at the last exchange, "
              "from rank 0's ranks.json.</p>")
        rows = []
        for r in c.ranks:
            s = r.sample
            age = "-" if r.sample_age_s is None else f"{r.sample_age_s:.1f} s" + (
                " (exchange)" if r.source == "exchange" else "")
            rows.append([esc(x) for x in (
                r.rank, r.host or "?", (s or {}).get("step", "-"), age,
                *(_cell(s, k, r.limits) for k in c.metrics), "; ".join(r.events))])
        p.add(_table([esc(h) for h in ("rank", "host", "step", "sample age", *c.metrics,
                                       "its bundles")], rows))
    return section


def _points(samples: list[dict[str, Any]], metric: str, t0: float
            ) -> tuple[list[float], list[float]]:
    pts = [(float(s["t"]) - t0, v) for s in samples
           if isinstance(s.get("t"), (int, float)) and (v := finite(s.get(metric))) is not None]
    if len(pts) > MAX_POINTS:  # each window drawn as its maximum: peaks are what kills a rank
        w = -(-len(pts) // MAX_POINTS)
        pts = [max(pts[i:i + w], key=lambda q: q[1]) for i in range(0, len(pts), w)]
    return [x for x, _ in pts], [y for _, y in pts]


def series_chart(c: JobComparison, metric: str) -> tuple[dict[str, Any], int] | None:
    """One line per rank of ``metric`` (seconds from the first failure), and how many ranks
    were left out (beyond :data:`MAX_RANK_LINES`)."""
    t0 = c.first.time
    lines: list[tuple[RankAtFailure, list[float], list[float]]] = []
    for r in c.ranks:
        if r.source == "timeline":
            xs, ys = _points(_read(c, r, "timeline") or [], metric, t0)
        else:
            v = finite((r.sample or {}).get(metric))
            xs, ys = ([-(r.sample_age_s or 0.0)], [v]) if v is not None else ([], [])
        if ys:
            lines.append((r, xs, ys))
    if not lines:
        return None
    lines.sort(key=lambda e: (e[0].rank != c.first.rank, -max(e[2])))
    left_out = max(len(lines) - MAX_RANK_LINES, 0)
    lines = lines[:MAX_RANK_LINES]
    unit, scale = charts.unit_for([y for _, _, ys in lines for y in ys])
    data = [{"type": "scatter", "mode": "lines" if r.source == "timeline" else "markers",
             "name": f"rank {r.rank} ({r.host or '?'})", "x": [round(x, 3) for x in xs],
             "y": [float(f"{y / scale:.5g}") for y in ys]} for r, xs, ys in lines]
    layout = {"title": {"text": f"{metric}, every rank", "font": {"size": 14}, "x": 0.01},
              "height": 320, "margin": {"l": 60, "r": 20, "t": 36, "b": 40},
              "xaxis": {"title": {"text": "seconds from the first failure"}},
              "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
              "legend": {"orientation": "h", "y": -0.25}, "hovermode": "x unified",
              "shapes": [{"type": "line", "x0": 0, "x1": 0, "xref": "x", "y0": 0, "y1": 1,
                          "yref": "paper", "line": {"color": "#d62728", "dash": "dot"}}],
              "annotations": [], "paper_bgcolor": "white", "plot_bgcolor": "#fbfbfb"}
    return {"data": data, "layout": layout}, left_out


def _series(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        p.add("<h2>Every rank's memory over time</h2>")
        for metric in c.metrics:
            got = series_chart(c, metric)
            if got is None:
                continue
            fig, left_out = got
            cap = (f"<code>{esc(metric)}</code> of every rank; the dotted line is the first "
                   "failure. Dots: a rank without a bundle, at the last exchange.")
            if left_out:
                cap += f" {left_out} more rank(s) not drawn (the highest are)."
            p.chart(fig, cap)
    return section


def _rank_findings(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        fs = sorted(p.d.findings, key=lambda f: (int(f.get("rank") or 0), str(f.get("kind"))))
        p.details("rank-findings", f"Each rank's verdicts ({len(fs)})")
        rows = []
        for f in fs:
            rate = finite(f.get("bytes_per_step"))
            rows.append([esc(f.get("rank")), esc(f.get("kind")),
                         f"<code>{esc(f.get('metric'))}</code>", esc(f.get("severity")),
                         esc(fmt_bytes(rate) + "/step" if rate else "-"),
                         esc(shorten(f.get("culprit") or f.get("message") or "", 240))])
        p.add(_table(["rank", "kind", "metric", "severity", "growth", "holder / message"], rows))
        p.end_details()
    return section


def _exchange(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        doc = next((d for r in c.ranks if r.path is not None
                    and isinstance(d := _read(c, r, "ranks.json"), dict)), None)
        if doc is None:
            return
        rows = [s for s in doc.get("summaries") or [] if isinstance(s, dict)]
        p.details("exchange", f"Rank 0's last exchange: every rank at that check "
                              f"({len(rows)} rank(s), ranks.json)")
        if doc.get("missing"):
            p.add(f"<p class='note'>Missing from the exchange: rank(s) "
                  f"{esc(', '.join(map(str, doc['missing'])))}"
                  + (f" ({esc(shorten(doc.get('exchange_error') or '', 200))})"
                     if doc.get("exchange_error") else "") + "</p>")
        cells = []
        for s in rows:
            peak: dict[str, Any] = s["peak"] if isinstance(s.get("peak"), dict) else {}
            node: dict[str, Any] = s["node"] if isinstance(s.get("node"), dict) else {}
            fs = ", ".join(f"{f.get('kind')} {f.get('metric')}" for f in s.get("findings") or []
                           if isinstance(f, dict)) or "-"
            cells.append([esc(x) for x in (
                s.get("rank"), node.get("name") or s.get("host"), s.get("epoch"), s.get("step"),
                fmt_bytes(finite(peak.get("host.rss"))), fmt_bytes(finite(peak.get("device.peak"))),
                fs)])
        p.add(_table(["rank", "host", "epoch", "step", "host.rss peak", "device peak",
                      "findings"], cells))
        p.end_details()
    return section


def _bundles(c: JobComparison) -> Callable[[Page], None]:
    def section(p: Page) -> None:
        p.details("bundles", f"The bundles read ({len(c.job.bundles)})")
        rows = [[str(b.rank), esc(b.host), esc(b.trigger), esc(b.classification or "-"),
                 f"<code>{esc(b.path)}</code>"] for b in c.job.bundles]
        p.add(_table(["rank", "host", "trigger", "class", "bundle (<code>memwatch report "
                      "BUNDLE</code> renders its own report)"], rows))
        p.end_details()
    return section


def render_job_html(job: Job, where: str = "", with_charts: bool = True) -> str:
    """The report of a distributed ``job`` (its bundles, as :func:`memwatch.report.jobs.
    group_jobs` grouped them) as one HTML document; ``where``: the paths it was read from."""
    c = compare(job)
    sections: list[tuple[str, Callable[[Page], None]]] = [
        ("header", header), ("job-story", _story(c)), ("verdicts", verdicts),
        ("job-ranks", _ranks_table(c)), ("job-series", _series(c)),
        ("job-findings", _rank_findings(c)), ("job-exchange", _exchange(c)),
        ("job-bundles", _bundles(c))]
    return render(job_data(c, where), with_charts=with_charts, sections=sections)
