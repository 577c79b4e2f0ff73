"""Plain-text rendering of a bundle summary, for ``memwatch inspect``."""

from __future__ import annotations

import datetime as _dt
import textwrap
from typing import Any

from memwatch.report.summary import SHOWN_METRICS, Summary, latest_findings, tensor_label
from memwatch.units import fmt_bytes

__all__ = ["render_text"]


def _utc(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%H:%M:%S")


def _bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "[" + "#" * n + "." * (width - n) + "]"


def render_text(s: Summary, tail_rows: int = 12) -> str:
    m = s.manifest
    out: list[str] = []
    cls = m.get("classification")
    kind = cls.get("kind") if isinstance(cls, dict) else cls
    out.append(f"memwatch bundle {s.path}")
    out.append(f"  written {m.get('created_utc', '?')} on {m.get('host', '?')} "
               f"(rank {m.get('rank', '?')}, pid {m.get('pid', '?')}), trigger: "
               f"{m.get('trigger', '?')}, class: {kind or '-'}, "
               f"{fmt_bytes(m.get('bytes'))} in {len(m.get('files') or {})} files"
               + (", captured before unwind" if m.get("pre_unwind") else ""))
    out.append("")
    out.append(s.headline)
    if s.exception:
        msg = str(s.exception.get("message", "")).strip().splitlines()
        first = msg[0] if msg else ""
        if len(first) > 240:
            first = first[:237] + "..."
        out.append(f"  {s.exception.get('type', '?')}: {first}")
    out.append("")
    out.append("How full memory was")
    if not s.fullness:
        out.append("  (no known limit for the metrics recorded)")
    for r in s.fullness:
        out.append(f"  {r['metric']:<34} {fmt_bytes(r['value']):>10} / {fmt_bytes(r['limit']):>10}"
                   f"  {_bar(r['utilization'])} {r['utilization'] * 100:5.1f}%")
    out.append("")
    out.append("Largest live tensors")
    if not s.top_tensors:
        out.append(f"  ({s.census_note or 'none recorded'})")
    for t in s.top_tensors[:10]:
        holder = t.get("holder")
        line = f"  {fmt_bytes(t.get('bytes')):>10}  x{t.get('count', 1):<5} {tensor_label(t)}"
        if holder:
            line += f"  held by {holder}"
        out.append(line)
    out.append("")
    latest = latest_findings(s.findings)
    more = (f"; the latest of each of {len(latest)} kind/metric pairs shown"
            if len(latest) < len(s.findings) else "")
    out.append(f"Findings ({len(s.findings)}{more})")
    for f in latest[:10]:
        head = f"[{f.get('severity', '?')}] {f.get('kind', '?')} {f.get('metric', '')}: "
        out.extend(textwrap.wrap(head + str(f.get("message", "")), width=100,
                                 initial_indent="  ", subsequent_indent="      "))
        if f.get("culprit"):
            out.extend(textwrap.wrap(f"culprit: {f['culprit']}", width=100,
                                     initial_indent="      ", subsequent_indent="        "))
        for tip in (f.get("suggestions") or [])[:1]:
            out.extend(textwrap.wrap(f"try: {tip}", width=100, initial_indent="      ",
                                     subsequent_indent="        "))
    if not s.findings:
        out.append("  (none)")
    out.append("")
    shown = [k for k in SHOWN_METRICS if k in s.keys]
    out.append(f"Timeline, last {min(len(s.tail), tail_rows)} of {len(s.tail)} samples in the "
               "final 5 minutes")
    if s.tail and shown:
        out.append("  " + f"{'time (UTC)':<10} {'step':>7} " + " ".join(f"{k:>16}" for k in shown))
        for r in s.tail[-tail_rows:]:
            vals = " ".join(f"{fmt_bytes(r.get(k)):>16}" for k in shown)
            out.append(f"  {_utc(r.get('t')):<10} {r.get('step', ''):>7} {vals}")
    else:
        out.append("  (no samples)")
    if s.epochs:
        out.append(f"  {len(s.epochs)} epoch summaries recorded")
    trimmed = m.get("trimmed") or []
    if trimmed:
        out.append("")
        out.append("Trimmed to fit the size cap: " + ", ".join(
            f"{t.get('file')} ({fmt_bytes(t.get('bytes'))})" for t in trimmed))
    if m.get("errors"):
        out.append("Files that could not be written: " + ", ".join(
            f"{k} ({v})" for k, v in m["errors"].items()))
    return "\n".join(out) + "\n"
