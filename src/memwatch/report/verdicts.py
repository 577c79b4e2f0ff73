"""The report's first screen in words: one card per verdict, or one line for a clean run.

A person opens a report to learn what leaks, who holds it, how fast, when it runs out and what to
change. :func:`cards` answers that from the findings (the current verdict of every belief, see
:mod:`memwatch.analysis.beliefs`; a leak whose growth stopped shows as stopped, with its
history), worst first: the kind and severity, the holder, the growth per step with its 95%
interval, the forecast against the limit, the fix, and the evidence the verdict rests on — the
trend statistics (always), a census diff between two checks (the holder), allocation sites
(``tracemalloc`` or the device's allocation history) — so a reader can tell how sure memwatch
is. :func:`clean_line` says a run without such a verdict is clean, and shows its peaks.

Example::

    >>> from memwatch.report.data import ReportData
    >>> from memwatch.report.verdicts import cards
    >>> f = {"kind": "leak", "metric": "host.rss", "severity": "warning",
    ...      "message": "...", "bytes_per_step": 2**20, "steps_to_oom": 1200,
    ...      "seconds_to_oom": 600, "culprit": "train.history (list, 300 tensors)",
    ...      "suggestions": ["store `loss.item()`"],
    ...      "evidence": {"holder": "train.history", "slope_ci_low": 2**19,
    ...                   "slope_ci_high": 2**21, "mann_kendall_p": 1e-6, "epochs_growing": 3,
    ...                   "limit_bytes": 2**31, "census_epochs": [2, 3]}}
    >>> c = cards(ReportData(title="t", source="live run", findings=[f]))[0]
    >>> c.holder, c.rate, c.fix
    ('train.history', '1.0 MiB/step (95% CI 512.0 KiB–2.0 MiB per step)', 'store `loss.item()`')
    >>> c.forecast
    'the 2.0 GiB limit is reached in about 1,200 steps (10 min)'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memwatch.analysis.beliefs import current, describe, history, state_of
from memwatch.core.units import fmt_bytes, fmt_duration
from memwatch.report.data import ReportData, epochs_in, finite
from memwatch.report.summary import SHOWN_METRICS

__all__ = ["Card", "Evidence", "cards", "clean_line", "peaks"]

#: The analyzer's significance level of the trend test (``ShapeConfig.alpha``'s default): a
#: card marks the test passed only under it.
TREND_ALPHA = 0.01
#: Kinds that get a card whatever their severity: growth that is held (a leak of low severity is
#: still a leak, and reaches the reader once) and a forecast out-of-memory.
CARD_KINDS: tuple[str, ...] = ("leak", "rank_leak", "near_oom", "rank_near_oom")
_SEVERITY = {"critical": 0, "warning": 1, "info": 2}


@dataclasses.dataclass
class Evidence:
    """One source a verdict rests on, and what it said (``found`` False: it was not used)."""

    name: str
    found: bool
    detail: str


@dataclasses.dataclass
class Card:
    """One verdict, as the first screen shows it."""

    kind: str
    severity: str
    metric: str
    when: str  # "epoch 4, step 240"
    holder: str | None
    holder_detail: str | None  # the culprit text after the holder's name
    rate: str | None
    forecast: str | None
    fix: str | None
    more_fixes: list[str]
    evidence: list[Evidence]
    message: str
    finding: dict[str, Any]
    #: How the belief came to its current state ("leak at epoch 1 (step 96) → stopped at
    #: epoch 3 (step 288)"); None when it never changed.
    history: str | None = None


def _sort_key(f: dict[str, Any]) -> tuple[int, float, int]:
    steps = finite(f.get("steps_to_oom"))
    kind = str(f.get("kind"))
    return (_SEVERITY.get(str(f.get("severity")), 3), steps if steps is not None else 1e300,
            CARD_KINDS.index(kind) if kind in CARD_KINDS else len(CARD_KINDS))


def _changes(d: ReportData, f: dict[str, Any]) -> list[dict[str, Any]]:
    b = f.get("belief")
    return history(d.findings, str(b)) if b else []


def verdict_findings(d: ReportData) -> list[dict[str, Any]]:
    """The findings that get a card, worst first: of the current verdicts (one per belief:
    the session's or ``summary.json``'s when the source has them), warning and critical ones of
    every kind, leaks and OOM forecasts of any severity, and beliefs that were leaks once and
    are not now (their history says why)."""
    now = d.current if d.current is not None else current(d.findings)
    got = [f for f in now
           if f.get("severity") in ("warning", "critical") or f.get("kind") in CARD_KINDS
           or (state_of(f) != "leak" and any(c["state"] == "leak" for c in _changes(d, f)))]
    return sorted(got, key=_sort_key)


def _holder(f: dict[str, Any]) -> tuple[str | None, str | None]:
    ev = f.get("evidence") or {}
    culprit = str(f.get("culprit") or "").strip() or None
    holder = str(ev.get("holder") or "").strip().lstrip("→ ").strip() or None
    if holder is None:
        return culprit, None
    rest = None
    if culprit and holder in culprit:
        rest = culprit.split(holder, 1)[1].strip() or None
    elif culprit:
        rest = culprit
    return holder, rest


def _rate(f: dict[str, Any]) -> str | None:
    bps = finite(f.get("bytes_per_step"))
    if bps is None:
        return None
    ev = f.get("evidence") or {}
    lo, hi = finite(ev.get("slope_ci_low")), finite(ev.get("slope_ci_high"))
    s = f"{fmt_bytes(bps)}/step"
    if lo is not None and hi is not None:
        s += f" (95% CI {fmt_bytes(lo)}–{fmt_bytes(hi)} per step)"
    return s


def _forecast(f: dict[str, Any], limits: dict[str, float]) -> str | None:
    ev = f.get("evidence") or {}
    limit = finite(ev.get("limit_bytes")) or finite(ev.get("limit")) or limits.get(
        str(f.get("metric")))
    steps, secs = finite(f.get("steps_to_oom")), finite(f.get("seconds_to_oom"))
    if limit is None:
        return "no memory limit is known to forecast against" if steps is None and f.get(
            "kind") in ("leak", "rank_leak") else None
    where = f"the {fmt_bytes(limit)} limit"
    if steps is None:
        peak = finite(ev.get("peak")) or finite(ev.get("peak_bytes"))
        if peak is None:
            return None
        return f"peaked at {fmt_bytes(peak)}, {peak / limit:.0%} of {where}"
    when = f"in about {steps:,.0f} steps" + (f" ({fmt_duration(secs)})" if secs else "")
    if f.get("severity") != "info":
        return f"{where} is reached {when}"
    left = finite(ev.get("remaining_steps"))
    after = f", after this run ends ({left:,.0f} steps left)" if left is not None else ""
    return f"{where} would be reached {when}{after}: not a threat to this run"


def _census_span(ev: dict[str, Any], epochs: bool) -> str | None:
    """What the census pair spans: "epochs 2→3", or in steps for a run without epochs."""
    at = ev.get("census_at_steps")
    if not epochs and isinstance(at, list) and len(at) == 2 and all(
            isinstance(x, int) for x in at):
        return f"steps {at[0]:,}→{at[1]:,}"
    pair = ev.get("census_epochs")
    if not isinstance(pair, list) or len(pair) < 2:
        return None
    return f"epochs {pair[0]}→{pair[-1]}" if epochs else "the last two checks"


def _census(f: dict[str, Any], epochs: bool = True) -> Evidence:
    ev = f.get("evidence") or {}
    if ev.get("census"):
        return Evidence("census diff", False, str(ev["census"]))
    span = _census_span(ev, epochs)
    if span is None:
        return Evidence("census diff", False, "no census of live objects for this verdict")
    groups = [g for g in ev.get("growing_groups") or [] if isinstance(g, dict)]
    explained, grown = finite(ev.get("explained_bytes")), finite(ev.get("rss_growth_bytes"))
    if ev.get("holder"):
        detail = f"{span}: the holder's growth explains the verdict"
        if explained and grown:
            detail = (f"{span}: weighed {fmt_bytes(explained)} held by it, "
                      f"of {fmt_bytes(grown)} of growth")
        return Evidence("census diff", True, detail)
    if groups:
        return Evidence("census diff", True, f"{span}: {len(groups)} growing group(s) of "
                                             "tensors, holder not found")
    return Evidence("census diff", False, f"{span}: no growing live tensor or container")


def _sites(f: dict[str, Any]) -> Evidence:
    ev = f.get("evidence") or {}
    traced = [t for t in ev.get("tracemalloc") or [] if isinstance(t, dict)]
    if traced:
        top = traced[0]
        grew = finite(top.get("bytes_delta"))
        return Evidence("allocation sites", True, f"tracemalloc: {top.get('where', '?')}"
                        + (f" (+{fmt_bytes(grew)})" if grew else ""))
    dev = [a for a in ev.get("alloc_sites") or [] if isinstance(a, dict)]
    if dev:
        return Evidence("allocation sites", True, f"allocation history: {dev[0].get('where')}")
    metric = str(f.get("metric"))
    how = ("record_history=True (CUDA)" if metric.startswith("device.")
           else "tracemalloc=True")
    return Evidence("allocation sites", False, f"not recorded (MemWatch({how}) names the line)")


def _trend(f: dict[str, Any], epochs: bool = True) -> Evidence:
    """The trend test, marked passed only where it passed: Mann–Kendall's p under the
    analyzer's significance level (:data:`TREND_ALPHA`). A leak can stand without it (growth
    held across checks, a rise that dominates its residuals): its card then says the test alone
    did not pass."""
    ev = f.get("evidence") or {}
    p = finite(ev.get("mann_kendall_p"))
    if p is None:
        share = finite(ev.get("share"))
        if share is not None:
            return Evidence("measured", True, f"the peak reached {share:.0%} of the limit")
        return Evidence("trend statistics", False, "no trend test for this verdict")
    passed = p < TREND_ALPHA
    parts = [f"Mann–Kendall p = {p:.1g}" + ("" if passed else
                                            f" (not significant alone: p ≥ {TREND_ALPHA:g})")]
    n = ev.get("epochs_growing")
    if isinstance(n, int):
        parts.append(f"{n} epoch(s) growing" if epochs else f"growing at {n} check(s)")
    r1 = finite(ev.get("lag1_autocorrelation"))
    if r1 is not None:
        parts.append(f"lag-1 autocorrelation {r1:.2f} (corrected for)")
    return Evidence("trend statistics", passed, ", ".join(parts))


def _evidence(f: dict[str, Any], epochs: bool = True) -> list[Evidence]:
    """What the verdict rests on. For growth held (a leak), all three sources, found or not: a
    trend alone is a weaker verdict than a trend whose holder a census diff named."""
    trend, census = _trend(f, epochs), _census(f, epochs)
    if f.get("kind") in ("leak", "rank_leak"):
        return [trend, census, _sites(f)]
    got = [e for e in (trend, census, _sites(f)) if e.found]
    return got or [trend]


def _when(f: dict[str, Any], epochs: bool = True) -> str:
    parts = []
    if f.get("epoch") is not None and epochs:
        parts.append(f"epoch {f['epoch']}")
    if f.get("step") is not None:
        parts.append(f"step {f['step']:,}" if isinstance(f["step"], int) else f"step {f['step']}")
    if f.get("rank") is not None:
        parts.append(f"rank {f['rank']}")
    return ", ".join(parts)


def cards(d: ReportData) -> list[Card]:
    """One card per verdict (see :func:`verdict_findings`), worst first."""
    out = []
    epochs = epochs_in(d)
    for f in verdict_findings(d):
        holder, rest = _holder(f)
        tips = [str(t) for t in f.get("suggestions") or [] if t]
        changes = _changes(d, f)
        out.append(Card(
            kind=str(f.get("kind", "")), severity=str(f.get("severity", "")),
            metric=str(f.get("metric", "")), when=_when(f, epochs), holder=holder,
            holder_detail=rest, rate=_rate(f), forecast=_forecast(f, d.limits),
            fix=tips[0] if tips else None, more_fixes=tips[1:], evidence=_evidence(f, epochs),
            message=str(f.get("message", "")), finding=f,
            history=describe(changes) if len(changes) > 1 else None))
    return out


def peaks(d: ReportData) -> list[tuple[str, float, float | None]]:
    """(metric, peak, limit) of the first metric with samples of each scope (device, host,
    workers, cgroup), in the order a person reads them."""
    out = []
    scopes: set[str] = set()
    for m in SHOWN_METRICS:
        vals = [v for v in d.values.get(m) or [] if v is not None]
        if vals and m.split(".")[0] not in scopes:
            scopes.add(m.split(".")[0])
            out.append((m, max(vals), d.limits.get(m)))
    return out


def _share(v: float, limit: float) -> str:
    s = v / limit
    return f"{s:.0%}" if s >= 0.095 else f"{s:.1%}" if s >= 0.001 else "<0.1%"


def clean_line(d: ReportData) -> str:
    """The first screen of a run without a verdict: one sentence, and its peaks."""
    n_info = len(current(d.findings))
    steps = d.steps[-1] if d.steps else None
    judged = f"{steps:,} steps judged" if steps else "judged"
    if epochs_in(d):
        head = (f"No leak and no out-of-memory risk found: {len(d.epochs)} epoch end(s) and "
                f"{judged}")
    elif d.findings or d.current is not None:
        head = f"No leak and no out-of-memory risk found: {judged}"
    else:
        head = ("No verdict yet: no check has judged this run (verdicts come at checks: epoch "
                "ends, checks sized to the run, and the last word when it ends)")
    peak = "; ".join(f"{m} {fmt_bytes(v)}" + (f" ({_share(v, lim)} of {fmt_bytes(lim)})"
                                              if lim else "") for m, v, lim in peaks(d)[:3])
    tail = f" ({n_info} informational finding(s) below)" if n_info else ""
    return head + (f". Peak: {peak}" if peak else "") + "." + tail
