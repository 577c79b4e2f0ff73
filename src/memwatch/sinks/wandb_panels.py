"""What :class:`memwatch.sinks.wandb.WandbSink` draws and summarises: the leak chart of one
finding (the floor at each check, the fitted trend, the forecast to the limit) and the run's
summary fields (the verdict, how many current verdicts, the worst forecast, the peaks).

Example::

    >>> from memwatch import Finding
    >>> from memwatch.sinks.wandb_panels import summary_fields
    >>> f = Finding(kind="leak", metric="host.rss", severity="warning", message="grows.",
    ...             steps_to_oom=1200.0)
    >>> out = summary_fields("memwatch", [f], "warning: leak in host.rss", [f], 3, {})
    >>> out["memwatch/verdict"], out["memwatch/findings"], out["memwatch/worst_steps_to_oom"]
    ('warning: leak in host.rss', 1, 1200.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from memwatch.core.findings import Finding
from memwatch.core.units import GIB, fmt_bytes

__all__ = ["leak_chart", "summary_fields"]


def _get(f: Any, name: str) -> Any:
    return f.get(name) if isinstance(f, Mapping) else getattr(f, name, None)


def leak_chart(wandb: Any, f: Finding, floors: list[tuple[int, float]],
               peaks: Mapping[str, float]) -> Any:
    """A ``line_series`` of ``f``'s metric: its floor at each check (``floors``: step, bytes),
    the fitted trend through the latest one, and, with a forecast, the way to the limit."""
    if not floors or not f.bytes_per_step:
        return None
    xs_f = [float(s) for s, _ in floors]
    ys_f = [v / GIB for _, v in floors]
    last_x, last_y = floors[-1]
    slope = float(f.bytes_per_step)
    first_x = xs_f[0]
    xs: list[list[float]] = [xs_f, [first_x, last_x]]
    ys: list[list[float]] = [ys_f, [(last_y + slope * (first_x - last_x)) / GIB, last_y / GIB]]
    keys = ["floor at each check", "fitted trend"]
    limit = f.evidence.get("limit_bytes")
    peak = f.evidence.get("peak_bytes") or peaks.get(f.metric, last_y)
    if f.steps_to_oom is not None and math.isfinite(f.steps_to_oom) and limit:
        end = last_x + float(f.steps_to_oom)
        xs.append([last_x, end])
        ys.append([float(peak) / GIB, float(limit) / GIB])
        keys.append("forecast")
        xs.append([first_x, end])
        ys.append([float(limit) / GIB, float(limit) / GIB])
        keys.append("limit")
    title = f"memwatch: {f.metric} leak, {fmt_bytes(slope)}/step"
    if f.steps_to_oom is not None and math.isfinite(f.steps_to_oom):
        title += f", OOM in ~{f.steps_to_oom:,.0f} steps"
    return wandb.plot.line_series(xs=xs, ys=ys, keys=keys, title=title,
                                  xname="step (GiB on y)")


def summary_fields(head: str, current: Sequence[Finding], verdict: str,
                   worst: Sequence[Any], total: int,
                   peaks: Mapping[str, float]) -> dict[str, Any]:
    """The run summary: ``verdict`` (the current belief, in words), ``findings`` (how many
    current verdicts, a plain number), ``findings_total`` (every finding said), the kinds that
    count, the soonest forecast of a threat and the peaks."""
    out: dict[str, Any] = {f"{head}/verdict": verdict, f"{head}/findings": len(current),
                           f"{head}/findings_total": total}
    if worst:
        out[f"{head}/verdict_kinds"] = sorted({f"{_get(f, 'kind')}:{_get(f, 'metric')}"
                                               for f in worst})
    forecasts = [f for f in worst if _get(f, "severity") != "info"
                 and isinstance(_get(f, "steps_to_oom"), (int, float))
                 and math.isfinite(_get(f, "steps_to_oom"))]
    if forecasts:
        f = min(forecasts, key=lambda x: float(_get(x, "steps_to_oom")))
        out[f"{head}/worst_steps_to_oom"] = float(_get(f, "steps_to_oom"))
        secs = _get(f, "seconds_to_oom")
        if isinstance(secs, (int, float)) and math.isfinite(secs):
            out[f"{head}/worst_seconds_to_oom"] = float(secs)
        out[f"{head}/worst_forecast"] = f"{_get(f, 'metric')}: {_get(f, 'message')}"
    for metric, v in sorted(peaks.items()):
        out[f"{head}/peak/{metric}_gib"] = v / GIB
    return out
