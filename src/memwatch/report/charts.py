"""Plotly figure specifications (plain dicts) for the HTML report, and the inlined plotly.js.

The report draws with plotly.js, inlined from the ``plotly`` package's own minified bundle
(``plotly/package_data/plotly.min.js``, ``pip install 'memwatch[report]'``), so the page needs no
network: PyTorch's snapshot viewer loads its script from a CDN, which an air-gapped cluster cannot
reach. Figures are built here as JSON-ready dicts (no import of plotly's Python API, which takes
seconds and is not needed to describe a line chart).
"""

from __future__ import annotations

import bisect
import importlib.util
import os
from typing import Any

from memwatch.report.data import ReportData
from memwatch.report.trends import TrendLine, fit_trend

__all__ = ["allocation_timeline", "check_steps", "memory_chart", "plotly_js", "segments_chart",
           "workers_chart"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
_UNITS = (("GiB", float(1 << 30)), ("MiB", float(1 << 20)), ("KiB", float(1 << 10)))


def plotly_js() -> str | None:
    """The text of plotly.min.js shipped in the ``plotly`` wheel, or None when not installed.

    Located without importing plotly (its import is slow and the report needs only the file);
    read at every call rather than kept: 4-5 MB held for the length of a run would be memwatch's
    largest allocation.
    """
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "package_data", "plotly.min.js")
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            continue
    return None


def unit_for(values: list[float]) -> tuple[str, float]:
    top = max((abs(v) for v in values), default=0.0)
    for name, scale in _UNITS:
        if top >= scale:
            return name, scale
    return "bytes", 1.0


def _num(v: float, scale: float) -> float:
    # Five significant digits: finer than a chart's pixels and its hover text (958.56 MiB), and
    # about a third fewer bytes per point than four decimals.
    return float(f"{v / scale:.5g}")


def _scaled(col: list[float | None], scale: float) -> list[float | None]:
    return [None if v is None else _num(v, scale) for v in col]


def check_steps(d: ReportData) -> list[tuple[int, str]]:
    """Where verdicts were judged: every epoch end, and each check that gave a finding (checks
    inside long epochs), with what it said."""
    said: dict[int, list[str]] = {}
    for e in d.epochs:
        end = e.get("end_step")
        if isinstance(end, int) and not isinstance(end, bool):
            said.setdefault(end, [])
    for f in d.findings:
        st = f.get("step")
        if isinstance(st, int) and not isinstance(st, bool):
            label = f"{f.get('kind')} ({f.get('severity')})"
            if label not in said.setdefault(st, []):
                said[st].append(label)
    return [(st, ", ".join(v) or "no verdict") for st, v in sorted(said.items())]


def _layout(title: str, unit: str, height: int = 300) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 36, "b": 40},
        "xaxis": {"title": {"text": "step"}, "zeroline": False},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.22},
        "hovermode": "x unified",
        "shapes": [],
        "annotations": [],
        "paper_bgcolor": "white",
        "plot_bgcolor": "#fbfbfb",
    }


def _epoch_marks(layout: dict[str, Any], d: ReportData, x_min: float, x_max: float) -> None:
    for e in d.epochs:
        end = e.get("end_step")
        if not isinstance(end, (int, float)) or not x_min <= end <= x_max:
            continue
        layout["shapes"].append({"type": "line", "xref": "x", "yref": "paper", "x0": end,
                                 "x1": end, "y0": 0, "y1": 1,
                                 "line": {"color": "#aaa", "width": 1, "dash": "dot"}})
        layout["annotations"].append({"x": end, "y": 1, "xref": "x", "yref": "paper",
                                      "text": f"end of epoch {e.get('epoch', '?')}",
                                      "showarrow": False, "font": {"size": 9, "color": "#888"},
                                      "xanchor": "right", "yanchor": "top", "textangle": -90})


def memory_chart(d: ReportData, metric: str, hero: bool = False
                 ) -> tuple[dict[str, Any], TrendLine | None] | None:
    """One metric over steps with epoch ends, its fitted trend and the forecast to its limit;
    ``hero`` (the first screen's chart) adds the series' floors and the checks' marks."""
    col = d.values.get(metric) or []
    vals = [v for v in col if v is not None]
    if not vals or not d.steps:
        return None
    trend = None
    try:
        trend = fit_trend(d, metric)
    except Exception:  # noqa: BLE001 - a chart without its trend line beats no chart
        trend = None
    extent = list(vals)
    x_max = float(d.steps[-1])
    forecast_to: float | None = None
    if trend is not None and trend.limit is not None:
        span = max(trend.x1 - float(d.steps[0]), 1.0)
        near = max(vals) >= 0.25 * trend.limit
        # Draw the forecast only when the limit is reached within three times the span shown:
        # further out, the line would squash the data into a corner (the caption says when).
        if trend.limit_step is not None and trend.limit_step <= trend.x1 + 3 * span:
            forecast_to = trend.limit_step
            near = True
        if near:
            extent.append(trend.limit)
    unit, scale = unit_for(extent)
    color = _COLORS[0]
    data: list[dict[str, Any]] = [{
        "type": "scatter", "mode": "lines", "name": metric, "x": d.steps,
        "y": _scaled(col, scale), "line": {"color": color, "width": 1.5},
        "hovertemplate": f"%{{y:.3f}} {unit}<extra>{metric}</extra>",
    }]
    floors = d.floors.get(metric) if hero else None
    if floors is not None:  # beneath the samples: where they part, the sawtooth shows
        data.insert(0, {"type": "scatter", "mode": "lines", "name": "floor (held)",
                        "x": floors[0], "y": [_num(v, scale) for v in floors[1]],
                        "line": {"color": "#7fc97f", "width": 4, "shape": "hvh"},
                        "hovertemplate": f"floor %{{y:.3f}} {unit}<extra></extra>"})
    if trend is not None and trend.significant:
        data.append({"type": "scatter", "mode": "lines", "name": "trend",
                     "x": [trend.x0, trend.x1],
                     "y": [_num(trend.y0, scale), _num(trend.y1, scale)],
                     "line": {"color": "#d62728", "width": 2, "dash": "dash"}})
        if forecast_to is not None and forecast_to > trend.x1:
            y_end = trend.y1 + trend.slope * (forecast_to - trend.x1)
            data.append({"type": "scatter", "mode": "lines", "name": "forecast",
                         "x": [trend.x1, forecast_to],
                         "y": [_num(trend.y1, scale), _num(y_end, scale)],
                         "line": {"color": "#d62728", "width": 1.5, "dash": "dot"}})
            x_max = max(x_max, forecast_to)
    if hero:
        _check_marks(data, d, col, scale)
    layout = _layout(metric, unit, height=340 if hero else 300)
    if trend is not None and trend.limit is not None and trend.limit in extent:
        layout["shapes"].append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1,
                                 "y0": trend.limit / scale, "y1": trend.limit / scale,
                                 "line": {"color": "#b00020", "width": 1.5, "dash": "dash"}})
        layout["annotations"].append({"xref": "paper", "x": 0.0, "y": trend.limit / scale,
                                      "text": "limit", "showarrow": False, "yanchor": "bottom",
                                      "xanchor": "left", "font": {"color": "#b00020",
                                                                  "size": 10}})
    _epoch_marks(layout, d, float(d.steps[0]), x_max)
    return {"data": data, "layout": layout}, trend


def _check_marks(data: list[dict[str, Any]], d: ReportData, col: list[float | None],
                 scale: float) -> None:
    """The checks as markers on the series, each saying what it judged."""
    xs: list[int] = []
    ys: list[float] = []
    texts: list[str] = []
    for st, said in check_steps(d):
        i = min(bisect.bisect_left(d.steps, st), len(d.steps) - 1)
        v = col[i]
        if v is None or abs(d.steps[i] - st) > max(1, (d.steps[-1] - d.steps[0]) // 50):
            continue
        xs.append(st)
        ys.append(_num(v, scale))
        texts.append(said)
    if xs:
        data.append({"type": "scatter", "mode": "markers", "name": "check", "x": xs, "y": ys,
                     "text": texts, "marker": {"symbol": "diamond", "size": 9,
                                               "color": "#444"},
                     "hovertemplate": "check at step %{x}: %{text}<extra></extra>"})


def workers_chart(d: ReportData) -> dict[str, Any] | None:
    """USS (solid) and RSS (dotted) per worker; the sums when per-worker data is absent."""
    data: list[dict[str, Any]] = []
    if d.workers:
        every = [v for w in d.workers for v in w["rss"] + w["uss"]]
        unit, scale = unit_for(every)
        for i, w in enumerate(d.workers):
            color = _COLORS[i % len(_COLORS)]
            for what, dash in (("uss", "solid"), ("rss", "dot")):
                data.append({"type": "scatter", "mode": "lines+markers",
                             "name": f"worker {w['index']} {what.upper()}", "x": w["steps"],
                             "y": _scaled(w[what], scale), "marker": {"size": 3},
                             "line": {"color": color, "dash": dash, "width": 1.5}})
        title = "DataLoader workers: USS (solid) and RSS (dotted) per worker"
    else:
        keys = [k for k in ("workers.rss", "workers.uss", "workers.pss", "workers.max_uss")
                if any(v is not None for v in d.values.get(k) or [])]
        if not keys:
            return None
        every = [v for k in keys for v in d.values[k] if v is not None]
        unit, scale = unit_for(every)
        for i, k in enumerate(keys):
            data.append({"type": "scatter", "mode": "lines", "name": k, "x": d.steps,
                         "y": _scaled(d.values[k], scale),
                         "line": {"color": _COLORS[i % len(_COLORS)], "width": 1.5}})
        title = "DataLoader workers, summed over workers: RSS vs USS"
    layout = _layout(title, unit, height=340)
    xs = [x for t in data for x in t["x"]]
    if xs:
        _epoch_marks(layout, d, float(min(xs)), float(max(xs)))
    return {"data": data, "layout": layout}


def segments_chart(view: dict[str, Any], max_segments: int = 300) -> dict[str, Any] | None:
    """Each segment as a stacked bar: allocated vs free bytes inside it."""
    segs = view.get("segments") or []
    if not segs:
        return None
    if len(segs) > max_segments:
        segs = sorted(sorted(segs, key=lambda s: -s["total"])[:max_segments],
                      key=lambda s: s["index"])
    unit, scale = unit_for([s["total"] for s in segs])
    x = [f"#{s['index']} {s['type']}".strip() for s in segs]
    data = [
        {"type": "bar", "name": "allocated", "x": x,
         "y": [_num(s["allocated"], scale) for s in segs], "marker": {"color": "#1f77b4"}},
        {"type": "bar", "name": "free (cached, inside the segment)", "x": x,
         "y": [_num(s["free"], scale) for s in segs], "marker": {"color": "#ff7f0e"}},
    ]
    layout = _layout("Allocator segments (address order)", unit, height=320)
    layout["barmode"] = "stack"
    layout["xaxis"] = {"title": {"text": "segment"}, "type": "category"}
    layout["hovermode"] = "closest"
    return {"data": data, "layout": layout}


def allocation_timeline(hist: dict[str, Any]) -> dict[str, Any] | None:
    """Bytes allocated after each history event, with the OOM events marked."""
    if not hist.get("x"):
        return None
    unit, scale = unit_for([float(v) for v in hist["y"]])
    data: list[dict[str, Any]] = [{
        "type": "scatter", "mode": "lines", "name": "allocated (from the history)",
        "x": hist["x"], "y": [_num(v, scale) for v in hist["y"]],
        "line": {"color": "#1f77b4", "width": 1.5, "shape": "hv"}}]
    layout = _layout("Allocation timeline (recorded history)", unit, height=300)
    layout["xaxis"] = {"title": {"text": "allocator event"}}
    for i in hist.get("oom_events") or []:
        layout["shapes"].append({"type": "line", "xref": "x", "yref": "paper", "x0": i, "x1": i,
                                 "y0": 0, "y1": 1, "line": {"color": "#b00020", "dash": "dash"}})
    return {"data": data, "layout": layout}
