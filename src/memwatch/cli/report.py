"""Write a self-contained HTML report (one file, opens offline: plotly.js is inlined).

SOURCE is a bundle directory, an output directory (``out_dir``, as ``memwatch inspect`` takes
it: the newest bundle there, or the first failure of the newest distributed job; a line on stderr
says which), or a JSONL/CSV export of samples (``.jsonl``, ``.json``, ``.csv``). Charts need the
``report`` extra (``pip install 'memwatch[report]'``); without it the report has its tables and
says what is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memwatch.bundle import open_bundle
from memwatch.cli._base import Command
from memwatch.cli._paths import is_output_dir, pick_bundle
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
                            help="a bundle directory, an output directory (its newest bundle), "
                                 "or a .jsonl/.csv export of samples")
        parser.add_argument("-o", "--output", default="report.html",
                            help="output file (default: report.html)")

    def run(self, args: argparse.Namespace) -> int:
        src = args.bundle
        out = Path(args.output)
        if out.is_dir():
            raise MemwatchError(f"-o {out} is a directory; name a file, e.g. "
                                f"-o {out / 'report.html'}")
        try:
            if src.lower().endswith(_EXPORT_SUFFIXES) and not os.path.isdir(src):
                # (a FIFO or a device named like an export is refused by the reader)
                html = render(from_export(src))
            else:
                if is_output_dir(Path(src)):
                    picked, line = pick_bundle(Path(src))
                    print(line, file=sys.stderr)
                    src = str(picked)
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
