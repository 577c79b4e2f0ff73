"""Write a self-contained HTML report (one file, opens offline: plotly.js is inlined).

SOURCE is a bundle directory, or a JSONL/CSV export of samples (``.jsonl``, ``.json``,
``.csv``). Charts need the ``report`` extra (``pip install 'memwatch[report]'``); without it the
report has its tables and says what is missing.
"""

from __future__ import annotations

import argparse
import os

from memwatch.bundle import open_bundle
from memwatch.cli._base import Command
from memwatch.report.html import render_bundle_html, render_export, write_html

_EXPORT_SUFFIXES = (".jsonl", ".json", ".csv")


class ReportCommand(Command):
    """Render SOURCE (a bundle or a JSONL/CSV export) as one offline HTML file."""

    name = "report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("bundle", metavar="SOURCE",
                            help="a bundle directory, or a .jsonl/.csv export of samples")
        parser.add_argument("-o", "--output", default="report.html",
                            help="output file (default: report.html)")

    def run(self, args: argparse.Namespace) -> int:
        src = args.bundle
        if os.path.isfile(src) and src.lower().endswith(_EXPORT_SUFFIXES):
            print(render_export(src, args.output))
            return 0
        bundle = open_bundle(src)
        bundle.snapshot()  # refuse a bundle whose snapshot is not a plain pickle
        # Atomic: a reader never sees half a report.
        print(write_html(render_bundle_html(bundle), args.output))
        return 0
