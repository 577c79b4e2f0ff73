"""The ``memwatch`` command line: one command class per file, its docstring is its help.

Bad input (a missing path, a truncated or corrupted bundle, a manifest of an unknown schema, a
snapshot that is not a plain pickle, a field of the wrong type, a symlink or FIFO inside a
bundle) prints one line on stderr and exits with code 2. Bundles and records are read trusting
nothing (:mod:`memwatch.bundle.reader`); whatever the commands print passes through a filter
that replaces terminal control characters (an escape sequence in a file name or a message could
otherwise retitle or clear the terminal), keeping only the colours of the rich view.

Example::

    >>> from memwatch.cli import main
    >>> main(["ls", str(tmp)])
    no bundles under ...
    0
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn, TextIO

from memwatch._version import __version__
from memwatch.cli._base import Command
from memwatch.cli.inspect import InspectCommand
from memwatch.cli.ls import LsCommand
from memwatch.cli.report import ReportCommand
from memwatch.cli.run import RunCommand
from memwatch.core.errors import MemwatchError
from memwatch.core.untrusted import printable

__all__ = ["CAUGHT_MALFORMED", "COMMANDS", "main"]

COMMANDS: tuple[type[Command], ...] = (LsCommand, InspectCommand, ReportCommand, RunCommand)
#: How many commands of this process ended in the last resort ("malformed input ... please
#: report this"), by exception type: input the readers' own checks let through. Every reader
#: refuses bad input itself; the fuzz tests assert this stays empty.
CAUGHT_MALFORMED: collections.Counter[str] = collections.Counter()


class _Parser(argparse.ArgumentParser):
    """argparse, with bad usage said in one line (``memwatch CMD: error: ...``), exit code 2.

    argparse's own ``error`` prints the whole usage block first; a person (or a log) wants the
    problem and the way to the help. Subcommand parsers are of this class too.
    """

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} -h)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, tuple[Command, argparse.ArgumentParser]]]:
    parser = _Parser(
        prog="memwatch", description="Inspect memwatch OOM bundles and write reports; run a "
        "training script under memwatch without editing it.")
    parser.add_argument("--version", action="version", version=f"memwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands: dict[str, tuple[Command, argparse.ArgumentParser]] = {}
    for cls in COMMANDS:
        cmd = cls()
        doc = (cls.__doc__ or "").strip()
        module_doc = (sys.modules[cls.__module__].__doc__ or "").strip()
        # The whole docstring, as one paragraph: its first line alone stops mid-sentence.
        p = sub.add_parser(cmd.name, help=" ".join(doc.split()) or None,
                           description=module_doc or doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.add_arguments(p)
        commands[cmd.name] = (cmd, p)
    return parser, commands


# Colour (SGR) sequences of the rich view pass; every other control character is replaced.
_SGR = re.compile(r"\x1b\[[0-9;]{0,32}m")


class _Printable:
    """A text stream that writes what it is given with terminal controls made visible."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        parts = _SGR.split(s)
        codes = _SGR.findall(s)
        out = printable(parts[0]) + "".join(
            c + printable(t) for c, t in zip(codes, parts[1:], strict=True))
        self._stream.write(out)
        return len(s)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding...
        return getattr(self._stream, name)


@contextlib.contextmanager
def _printable_output() -> Iterator[None]:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _one_line(text: str) -> str:
    return " ".join(printable(text).split())[:2000]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input or usage)."""
    parser, commands = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's own parser: `memwatch ls: error: ...`
            commands[args.command][1].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse: usage errors exit 2, --help/--version exit 0
        return int(e.code) if isinstance(e.code, int) else 2
    with _printable_output():
        return _run(commands[args.command][0], args)


def _run(cmd: Command, args: argparse.Namespace) -> int:
    try:
        return cmd.run(args)
    except (MemwatchError, OSError) as e:
        print(f"memwatch {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError,
            UnicodeError, OverflowError, ZeroDivisionError) as e:
        # The input files are the only thing a command reads: whatever they hold that the
        # reader's checks let through is still bad input, said in one line. It is a bug of the
        # readers all the same: counted, so that the fuzz tests can fail on it.
        CAUGHT_MALFORMED[type(e).__name__] += 1
        print(f"memwatch {args.command}: error: malformed input ({type(e).__name__}: "
              f"{_one_line(str(e))[:300]}); if memwatch wrote it, please report this",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
