"""Renderers of runs, bundles and exports: offline HTML (plotly inlined) and terminal views."""

from memwatch.report.html import render, render_bundle_html, render_export, render_run
from memwatch.report.summary import Summary, summarize
from memwatch.report.terminal import print_epoch_summary, print_summary, render_text

__all__ = ["Summary", "print_epoch_summary", "print_summary", "render", "render_bundle_html",
           "render_export", "render_run", "render_text", "summarize"]
