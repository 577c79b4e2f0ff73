"""The page the HTML report's sections write into: HTML parts, chart figures, notes.

:func:`memwatch.report.html.render` runs the sections in order on one :class:`Page`. A section
that raises is dropped whole and becomes a note at the bottom of the page: one section never
costs the report. Sections below the first screen wrap themselves in ``<details>`` (collapsed);
their charts are drawn when they are opened.
"""

from __future__ import annotations

import html as _html
import re
from collections.abc import Callable
from typing import Any

from memwatch.report.data import ReportData

__all__ = ["Page", "esc", "rich"]


def esc(x: Any) -> str:
    """HTML-escape ``str(x)``, quotes included."""
    return _html.escape(str(x), quote=True)


_CODE = re.compile(r"`([^`]+)`")


def rich(x: Any) -> str:
    """``esc(x)`` with ```code``` spans (as memwatch's suggestions write them) set as code."""
    return _CODE.sub(r"<code>\1</code>", esc(x))


class Page:
    """Accumulates sections and chart figures; renders them into one document."""

    def __init__(self, d: ReportData, with_charts: bool) -> None:
        self.d = d
        self.with_charts = with_charts
        self.parts: list[str] = []
        self.figures: list[dict[str, Any]] = []
        self.notes: list[str] = list(d.notes)
        #: Metrics whose chart the first screen shows (not repeated below).
        self.shown: set[str] = set()

    def add(self, html: str) -> None:
        self.parts.append(html)

    def chart(self, fig: dict[str, Any] | None, caption: str = "") -> None:
        if fig is None:
            return
        if not self.with_charts:
            if caption:
                self.add(f"<p class='caption'>{caption}</p>")
            return
        fid = f"mw-chart-{len(self.figures)}"
        self.figures.append({"id": fid, **fig})
        self.add(f"<div class='chart' id='{fid}'></div>")
        if caption:
            self.add(f"<p class='caption'>{caption}</p>")

    def details(self, name: str, summary: str) -> None:
        """Open a collapsed section (closed by :meth:`end_details`); ``summary`` is HTML."""
        self.add(f"<details id='mw-more-{esc(name)}'><summary>{summary}</summary>")

    def end_details(self) -> None:
        self.add("</details>")

    def section(self, name: str, fn: Callable[[Page], None]) -> None:
        mark = len(self.parts)
        nfig = len(self.figures)
        try:
            self.add(f"<section id='mw-{name}'>")
            fn(self)
            self.add("</section>")
        except Exception as e:  # noqa: BLE001 - one section never costs the whole report
            del self.parts[mark:]
            del self.figures[nfig:]
            self.notes.append(f"The {name} section could not be rendered "
                              f"({type(e).__name__}: {e}).")
