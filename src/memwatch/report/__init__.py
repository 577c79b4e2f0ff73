"""Renderers of bundles and runs: terminal text (``memwatch inspect``) and offline HTML."""

from memwatch.report.html import render_bundle_html
from memwatch.report.summary import Summary, summarize
from memwatch.report.terminal import render_text

__all__ = ["Summary", "render_bundle_html", "render_text", "summarize"]
