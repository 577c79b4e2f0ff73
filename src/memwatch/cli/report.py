"""Write a self-contained HTML report (one file, opens offline: plotly.js is inlined).

SOURCE is a bundle directory, an output directory (``out_dir``, as ``memwatch inspect`` takes
it: the newest bundle there, or the first failure of the newest distributed job; a line on stderr
says which), or a JSONL/CSV export of samples (``.jsonl``, ``.json``, ``.csv``). An output
directory without bundles gives the report of the run that ended there (the ``report.html`` it
wrote when it closed), or one report of a finished distributed job (every rank's verdicts and
rank 0's verdicts across ranks). Charts need the
``report`` extra (``pip install 'memwatch[report]'``); without it the report has its tables and
says what is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memwatch.bundle import Bundle, open_bundle
from memwatch.cli._base import Command
from memwatch.cli._paths import bundle_entries, is_output_dir, pick_bundle
from memwatch.cli._runs import finished_html
from memwatch.core.errors import MemwatchError
from memwatch.report.exports import from_export
from memwatch.report.html import render, render_bundle_html, write_html

_EXPORT_SUFFIXES = (".jsonl", ".json", ".csv")


class ReportCommand(Command):
    """Render SOURCE (a bundle, an output directory or a JSONL/CSV export) as one offline HTML
    file."""

    name = "report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("bundle", metavar="SOURCE",
                            help="a bundle directory, an output directory (its newest bundle, "
                                 "else the run or job that ended there), or a .jsonl/.csv "
                                 "export of samples")
        parser.add_argument("-o", "--output", default="report.html",
                            help="output file (default: report.html)")

    def run(self, args: argparse.Namespace) -> int:
        src = args.bundle
        out = Path(args.output)
        if out.is_dir():
            raise MemwatchError(f"-o {out} is a directory; name a file, e.g. "
                                f"-o {out / 'report.html'}")
        try:
            if os.path.isfile(src) and src.lower().endswith(_EXPORT_SUFFIXES):
                html = render(from_export(src))
            else:
                html = ""
                if is_output_dir(Path(src)):
                    if not any(isinstance(b, Bundle) for _, b in bundle_entries(Path(src))):
                        html = finished_html([src], src)  # the run that ended there, or job
                    else:
                        picked, line = pick_bundle(Path(src))
                        print(line, file=sys.stderr)
                        src = str(picked)
                if not html:
                    bundle = open_bundle(src)
                    bundle.snapshot()  # refuse a bundle whose snapshot is not a plain pickle
                    html = render_bundle_html(bundle)
        except OSError as e:  # reading SOURCE
            raise MemwatchError(f"cannot read {e.filename or src}: {e.strerror or e}") from None
        try:
            print(write_html(html, out))  # atomic: a reader never sees half a report
        except OSError as e:
            raise MemwatchError(f"cannot write {e.filename or out}: {e.strerror or e} "
                                "(choose another -o path)") from None
        return 0
