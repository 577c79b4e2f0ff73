"""How a bundle is announced to the person watching the run: one line per bundle, with a command
that runs as printed.

A bundle written for an exception is named in a note under that exception's traceback
(``exc.add_note``, Python 3.11+): the traceback is where the reader of a crash looks, and a log
line as well would say the same thing twice, once above the traceback and once below it. Every
other bundle (signal, watchdog, manual; an exception that takes no note) gets one warning on the
``memwatch`` logger; the end-of-run bundle a sink asks for at a clean close, which is no
failure, one line at level INFO.

The command printed to look inside is :func:`cli_command`'s: ``memwatch`` alone is right only when
the console script of *this* interpreter is the one on ``PATH``; after ``make venv`` without
activating the environment it is not on ``PATH`` at all, and a ``memwatch`` of another
environment may be older.

Example::

    >>> from memwatch.runtime.announce import cli_command
    >>> cmd = cli_command()
    >>> cmd == "memwatch" or cmd.endswith("memwatch") or cmd.endswith(" -m memwatch")
    True
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["announce_bundle", "cli_command", "cli_line"]

log = logging.getLogger("memwatch")


def cli_command() -> str:
    """``memwatch`` when this interpreter's console script is the one on ``PATH``; else that
    script's path (relative to the working directory when it lies below it, as
    ``.venv/bin/memwatch``); else ``<this python> -m memwatch``."""
    script = Path(sys.executable).with_name("memwatch")
    try:
        if not script.is_file():
            return f"{shlex.quote(sys.executable)} -m memwatch"
        found = shutil.which("memwatch")
        if found and os.path.samefile(found, script):
            return "memwatch"
        rel = os.path.relpath(script)
        shown = rel if not rel.startswith("..") else str(script)
        return shlex.quote(shown if os.sep in shown else os.path.join(".", shown))
    except (OSError, ValueError):  # a vanished file, another drive (Windows)
        return f"{shlex.quote(sys.executable)} -m memwatch"


def cli_line(*args: str | os.PathLike[str]) -> str:
    """A whole command line, each argument quoted for a POSIX shell:
    ``cli_line("inspect", path)`` -> ``.venv/bin/memwatch inspect /runs/oom/2026...``."""
    return " ".join([cli_command(), *(shlex.quote(os.fspath(a)) for a in args)])


def announce_bundle(path: Path, trigger: str, exc: BaseException | None = None) -> None:
    """Say once that the bundle at ``path`` was written: a note on ``exc`` when there is one that
    takes notes, else a warning on the ``memwatch`` logger (an end-of-run bundle, no failure:
    a line at level INFO). Never raises."""
    try:
        if exc is not None and hasattr(exc, "add_note"):
            exc.add_note(f"memwatch: diagnostic bundle written to {path} "
                         f"(look inside: {cli_line('inspect', path)})")
            return
    except Exception:  # noqa: BLE001 - an exception class that refuses notes: the log says it
        pass
    if trigger == "end_of_run":  # a clean end: not a failure, and nothing to act on
        log.info("memwatch: the run's report and snapshot for the sinks written to %s", path)
        return
    log.warning("memwatch: %s bundle written to %s", trigger, path)
