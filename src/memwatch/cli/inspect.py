"""Summarise a bundle in the terminal.

What ran out, how full memory was, the largest live tensors and what held them, the analyzer's
findings, the allocator's segments (from the snapshot, read with a restricted unpickler that never
runs code) and the last minutes of the timeline.
"""

from __future__ import annotations

import argparse

from memwatch.bundle import open_bundle
from memwatch.cli._base import Command
from memwatch.errors import MemwatchError
from memwatch.evidence import segments_summary
from memwatch.report.summary import summarize
from memwatch.report.terminal import print_summary
from memwatch.units import fmt_bytes


class InspectCommand(Command):
    """Print a terminal summary of BUNDLE: what ran out, how full, who held it, findings."""

    name = "inspect"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("bundle", metavar="BUNDLE", help="a bundle directory")
        parser.add_argument("--rows", type=int, default=12,
                            help="timeline rows to show (default 12)")
        parser.add_argument("--format", choices=("auto", "rich", "plain"), default="auto",
                            help="auto (default): rich tables on a terminal when rich is "
                                 "installed, plain text otherwise")

    def run(self, args: argparse.Namespace) -> int:
        bundle = open_bundle(args.bundle)
        summary = summarize(bundle)
        snap = bundle.snapshot()  # validates the pickle too: a bad one exits 2
        seg = segments_summary(snap)
        extra = ""
        if seg is not None:
            extra = (f"\nAllocator snapshot: {seg['segments']} segments, "
                     f"{fmt_bytes(seg['reserved_bytes'])} reserved, "
                     f"{fmt_bytes(seg['allocated_bytes'])} allocated, largest free block "
                     f"{fmt_bytes(seg['largest_free_block_bytes'])}\n")
        try:
            print_summary(summary, tail_rows=max(args.rows, 0), fmt=args.format, extra=extra)
        except ImportError as e:  # --format rich without rich: one line, exit code 2
            raise MemwatchError(str(e)) from None
        return 0
