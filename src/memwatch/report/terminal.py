"""Terminal views: a bundle summary for ``memwatch inspect`` and end-of-epoch summaries.

Two renderers of the same content: :func:`render_text` (plain text, always available, what a
pipe or a log file gets) and, with `rich <https://rich.readthedocs.io>`_ installed
(``pip install 'memwatch[report]'``), coloured tables for a terminal. :func:`print_summary` and
:func:`print_epoch_summary` pick rich when it is importable and the output is a terminal, and fall
back to plain text otherwise; rich is imported lazily, never by ``import memwatch``.

Example::

    >>> import memwatch
    >>> from memwatch.report.terminal import epoch_summary_text
    >>> mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp), signals=False)
    >>> with mw:
    ...     for _ in range(10):
    ...         mw.step()
    ...     text = epoch_summary_text(mw, mw.end_epoch())
    >>> text.splitlines()[0]
    'memwatch: epoch 0 ended at step 10 (10 steps)'
"""

from __future__ import annotations

import datetime as _dt
import io
import os
import sys
import textwrap
from typing import IO, TYPE_CHECKING, Any

from memwatch.core.units import fmt_bytes
from memwatch.report.summary import (
    SHOWN_METRICS,
    Summary,
    killer_lines,
    latest_findings,
    tensor_label,
)
from memwatch.report.text import shorten

if TYPE_CHECKING:
    from memwatch.core.findings import Finding
    from memwatch.core.protocols import LiveRun

__all__ = ["epoch_summary_text", "print_epoch_summary", "print_summary", "render_rich",
           "render_text", "rich_available"]

_SEV_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "green"}


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
        out.append(f"  {s.exception.get('type', '?')}: "
                   f"{shorten(s.exception.get('message') or '', 240)}")
    out.append("")
    out.append("How full memory was")
    if not s.fullness:
        out.append("  (no known limit for the metrics recorded)")
    for r in s.fullness:
        out.append(f"  {r['metric']:<34} {fmt_bytes(r['value']):>10} / {fmt_bytes(r['limit']):>10}"
                   f"  {_bar(r['utilization'])} {r['utilization'] * 100:5.1f}%")
    out.append("")
    killer = killer_lines(s)
    if killer:
        out.append("What grew since the last check")
        out.extend(f"  {ln}" for ln in killer)
        out.append("")
    out.append("Largest live tensors")
    if not s.top_tensors:
        out.append(f"  ({s.census_note or 'none recorded'})")
    for t in s.top_tensors[:10]:
        holder = t.get("holder")
        line = f"  {fmt_bytes(t.get('bytes')):>10}  x{str(t.get('count', 1)):<5} {tensor_label(t)}"
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


# --------------------------------------------------------------------------- rich
def rich_available() -> bool:
    """Whether the ``rich`` package can be imported (the ``report`` extra)."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _use_rich(stream: IO[str], fmt: str) -> bool:
    if fmt == "plain":
        return False
    if fmt == "rich":
        if not rich_available():
            raise ImportError("the rich terminal view needs rich: pip install 'memwatch[report]'")
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR") and rich_available()


def render_rich(s: Summary, tail_rows: int = 12, width: int | None = None,
                color: bool = True) -> str:
    """The bundle summary as rich tables, returned as text (ANSI colours when ``color``)."""
    from rich import box
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    m = s.manifest
    cls = m.get("classification")
    kind = cls.get("kind") if isinstance(cls, dict) else cls
    parts: list[Any] = []
    head = Text(s.headline, style="bold red" if kind else "bold")
    if s.exception:
        head.append(f"\n{s.exception.get('type', '?')}: "
                    f"{shorten(s.exception.get('message') or '', 300)}", style="default")
    parts.append(Panel(head, title=f"memwatch bundle {m.get('name', '')}", subtitle=(
        f"{m.get('created_utc', '?')} on {m.get('host', '?')}, rank {m.get('rank', '?')}, "
        f"trigger {m.get('trigger', '?')}, class {kind or '-'}"), box=box.ROUNDED))
    t = Table(title="How full memory was", box=box.SIMPLE_HEAD, title_justify="left")
    for c, j in (("metric", "left"), ("value", "right"), ("limit", "right"), ("used", "left")):
        t.add_column(c, justify=j)  # type: ignore[arg-type]
    for r in s.fullness:
        u = float(r["utilization"])
        style = "red" if u >= 0.95 else "yellow" if u >= 0.85 else "green"
        t.add_row(str(r["metric"]), fmt_bytes(r["value"]), fmt_bytes(r["limit"]),
                  Text(f"{_bar(u)} {u * 100:5.1f}%", style=style))
    if not s.fullness:
        t.add_row("(no known limit for the metrics recorded)", "", "", "")
    parts.append(t)
    killer = killer_lines(s)
    if killer:
        parts.append(Panel(Text("\n".join(killer)), title="What grew since the last check",
                           box=box.ROUNDED))
    t = Table(title="Largest live tensors", box=box.SIMPLE_HEAD, title_justify="left")
    for c in ("bytes", "count", "tensor", "held by"):
        t.add_column(c, justify="right" if c in ("bytes", "count") else "left")
    for tt in s.top_tensors[:10]:
        t.add_row(fmt_bytes(tt.get("bytes")), str(tt.get("count", 1)), tensor_label(tt),
                  str(tt.get("holder") or ""))
    if not s.top_tensors:
        t.add_row("", "", s.census_note or "none recorded", "")
    parts.append(t)
    latest = latest_findings(s.findings)
    t = Table(title=f"Findings ({len(s.findings)})", box=box.SIMPLE_HEAD, title_justify="left")
    for c in ("severity", "kind", "metric", "verdict, culprit, first suggestion"):
        t.add_column(c)
    for f in latest[:10]:
        sev = str(f.get("severity", "?"))
        body = Text(str(f.get("message", "")))
        if f.get("culprit"):
            body.append(f"\nculprit: {f['culprit']}", style="bold")
        for tip in (f.get("suggestions") or [])[:1]:
            body.append(f"\ntry: {tip}", style="cyan")
        t.add_row(Text(sev, style=_SEV_STYLE.get(sev, "")), str(f.get("kind", "?")),
                  str(f.get("metric", "")), body)
    if not s.findings:
        t.add_row("", "", "", "(none)")
    parts.append(t)
    shown = [k for k in SHOWN_METRICS if k in s.keys]
    t = Table(title=f"Timeline, last {min(len(s.tail), tail_rows)} of {len(s.tail)} samples in "
              "the final 5 minutes", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("time (UTC)")
    t.add_column("step", justify="right")
    for k in shown:
        t.add_column(k, justify="right")
    for r in s.tail[-tail_rows:] if tail_rows else []:
        t.add_row(_utc(r.get("t")), str(r.get("step", "")), *(fmt_bytes(r.get(k)) for k in shown))
    parts.append(t)
    if s.epochs:
        parts.append(Text(f"{len(s.epochs)} epoch summaries recorded", style="dim"))
    buf = io.StringIO()
    console = Console(file=buf, width=width or 120, force_terminal=color, color_system=(
        "standard" if color else None), highlight=False)
    console.print(Group(*parts))
    return buf.getvalue()


def print_summary(s: Summary, tail_rows: int = 12, file: IO[str] | None = None,
                  fmt: str = "auto", extra: str = "") -> None:
    """Print a bundle summary: rich tables on a terminal, plain text otherwise.

    ``fmt`` is ``"auto"`` (rich when installed and ``file`` is a terminal and ``NO_COLOR`` is
    unset), ``"rich"`` (raises ImportError naming the extra when rich is missing) or ``"plain"``.
    ``extra`` is appended as plain text (the allocator line of ``memwatch inspect``).
    """
    stream = file or sys.stdout
    if _use_rich(stream, fmt):
        import shutil

        width = shutil.get_terminal_size((120, 40)).columns
        stream.write(render_rich(s, tail_rows, width=width, color=fmt != "rich" or
                                 bool(getattr(stream, "isatty", lambda: False)())))
    else:
        stream.write(render_text(s, tail_rows))
    if extra:
        stream.write(extra)


# --------------------------------------------------------------------------- epochs
def _epoch_rows(mw: LiveRun) -> list[tuple[str, float, float, float | None]]:
    """(metric, floor, peak, change of floor vs the previous epoch) for the shown metrics."""
    eps = mw.epochs
    if not eps:
        return []
    cur = eps[-1]
    prev = eps[-2] if len(eps) >= 2 else None
    rows = []
    for k in SHOWN_METRICS:
        if k not in cur.keys:
            continue
        i = cur.col(k)
        floor, peak = float(cur.floor[i]), float(cur.peak[i])
        if floor != floor:  # NaN: not available here
            continue
        change = None
        if prev is not None and k in prev.keys:
            pf = float(prev.floor[prev.col(k)])
            change = floor - pf if pf == pf else None
        rows.append((k, floor, peak, change))
    return rows


def _signed(n: float | None) -> str:
    if n is None:
        return "-"
    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n))


def epoch_summary_text(mw: LiveRun, findings: list[Finding] | None = None) -> str:
    """The epoch just closed, as plain text: floor, peak and floor change per metric, and the
    findings of this epoch end (``findings``: what ``end_epoch()`` returned)."""
    eps = mw.epochs
    if not eps:
        return "memwatch: no epoch closed yet\n"
    e = eps[-1]
    out = [f"memwatch: epoch {e.epoch} ended at step {e.end_step} ({e.n_steps} steps)"]
    rows = _epoch_rows(mw)
    if rows:
        out.append(f"  {'metric':<18} {'floor':>11} {'peak':>11} {'floor vs previous':>18}")
        for k, floor, peak, change in rows:
            out.append(f"  {k:<18} {fmt_bytes(floor):>11} {fmt_bytes(peak):>11} "
                       f"{_signed(change):>18}")
    for f in findings or []:
        out.extend(textwrap.wrap(f"[{f.severity}] {f.kind} {f.metric}: {f.message}", width=100,
                                 initial_indent="  ", subsequent_indent="      "))
        if f.culprit:
            out.append(f"      culprit: {f.culprit}")
    if not findings:
        out.append("  no new findings")
    return "\n".join(out) + "\n"


def print_epoch_summary(mw: LiveRun, findings: list[Finding] | None = None,
                        file: IO[str] | None = None, fmt: str = "auto") -> None:
    """Print :func:`epoch_summary_text`, as a rich table on a terminal. Never raises (it runs in
    the training loop): a failure prints one line instead."""
    stream = file or sys.stdout
    try:
        if not _use_rich(stream, fmt):
            stream.write(epoch_summary_text(mw, findings))
            return
        from rich import box
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        e = mw.epochs[-1]
        t = Table(title=f"memwatch: epoch {e.epoch} ended at step {e.end_step} "
                  f"({e.n_steps} steps)", box=box.SIMPLE_HEAD, title_justify="left")
        for c in ("metric", "floor", "peak", "floor vs previous"):
            t.add_column(c, justify="left" if c == "metric" else "right")
        for k, floor, peak, change in _epoch_rows(mw):
            style = "yellow" if change is not None and change > 0 else ""
            t.add_row(k, fmt_bytes(floor), fmt_bytes(peak), Text(_signed(change), style=style))
        console = Console(file=stream, highlight=False,
                          force_terminal=True if fmt == "rich" else None)
        console.print(t)
        for f in findings or []:
            console.print(Text(f"[{f.severity}] ", style=_SEV_STYLE.get(f.severity, "")) +
                          Text(f"{f.kind} {f.metric}: {f.message}"))
            if f.culprit:
                console.print(Text(f"    culprit: {f.culprit}", style="bold"))
        if not findings:
            console.print(Text("no new findings", style="dim"))
    except Exception as exc:  # noqa: BLE001 - a summary never stops training
        stream.write(f"memwatch: epoch summary unavailable ({type(exc).__name__}: {exc})\n")
