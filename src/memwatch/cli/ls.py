"""List OOM bundles: time, trigger, classification, size (and why a broken one cannot be read).

DIR is a memwatch output directory (the one given as ``out_dir``; default ``./memwatch``) or its
``oom/`` subdirectory.
"""

from __future__ import annotations

import argparse
import sys

from memwatch.bundle import Bundle, find_bundles
from memwatch.cli._base import Command
from memwatch.units import fmt_bytes


class LsCommand(Command):
    """List the bundles under DIR (default ./memwatch), oldest first."""

    name = "ls"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", nargs="?", default="memwatch", metavar="DIR",
                            help="output directory or its oom/ folder (default: ./memwatch)")

    def run(self, args: argparse.Namespace) -> int:
        entries = find_bundles(args.dir)
        if not entries:
            print(f"no bundles under {args.dir}")
            return 0
        print(f"{'time (UTC)':<26} {'trigger':<13} {'class':<9} {'size':>10}  bundle")
        for path, b in entries:
            if isinstance(b, Bundle):
                m = b.manifest
                cls = m.get("classification") or "-"
                print(f"{str(m.get('created_utc', '?')):<26} {str(m.get('trigger', '?')):<13} "
                      f"{str(cls):<9} {fmt_bytes(m.get('bytes')):>10}  {path}")
            else:
                print(f"{'?':<26} {'unreadable':<13} {'-':<9} {'':>10}  {path}  ({b})",
                      file=sys.stdout)
        return 0
