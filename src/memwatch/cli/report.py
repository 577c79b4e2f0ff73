"""Write a self-contained HTML report of a bundle (one file, opens offline, no scripts)."""

from __future__ import annotations

import argparse
import os
import tempfile

from memwatch.bundle import open_bundle
from memwatch.cli._base import Command
from memwatch.report.html import render_bundle_html


class ReportCommand(Command):
    """Render BUNDLE as one offline HTML file (default: report.html)."""

    name = "report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("bundle", metavar="BUNDLE", help="a bundle directory")
        parser.add_argument("-o", "--output", default="report.html",
                            help="output file (default: report.html)")

    def run(self, args: argparse.Namespace) -> int:
        bundle = open_bundle(args.bundle)
        bundle.snapshot()  # refuse a bundle whose snapshot is not a plain pickle
        html = render_bundle_html(bundle)
        out = os.path.abspath(args.output)
        # Atomic: a reader never sees half a report.
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html",
                                   dir=os.path.dirname(out) or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(html)
            os.replace(tmp, out)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        print(out)
        return 0
