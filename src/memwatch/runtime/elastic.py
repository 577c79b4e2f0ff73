"""The failing rank's story where torchrun looks for it: torchelastic's error file.

torchrun (torchelastic) gives each worker a file for its error (``TORCHELASTIC_ERROR_FILE``),
and prints what the file says in its failure summary (``error_file:`` and ``traceback :`` of
"Root Cause (first observed failure)" and of every other failed rank). Only an entry point
decorated with ``torch.distributed.elastic.multiprocessing.errors.record`` writes it; without one
the summary says ``error_file: <N/A>`` and points at the docs. When memwatch writes a bundle for a
failure of such a worker (an exception, or the launcher's SIGTERM), it also writes that file, in
the JSON ``@record``'s ``ErrorHandler.record_exception`` writes::

    {"message": {"message": "<Type>: <message>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<unix seconds>"}}}

with the traceback ending in memwatch's note that names the bundle, so torchrun's summary points
at it.

* Never over a file anyone else wrote, and whole or not at all (the agent cannot parse half a
  file): it is written under a temporary name beside it and hard-linked to its name, which fails
  if the name exists (a link never follows a symlink at the name). Only memwatch's own earlier
  file, still as it wrote it, is replaced: by a later failure of the same process (the earlier
  one, an OOM inside ``capture_oom()`` say, was recovered from; the later one ended it).
  ``@record`` writes it before the exception reaches memwatch's ``sys.excepthook`` (its
  traceback then already carries memwatch's note when ``watch()`` or an adapter wrote the bundle
  first); where memwatch wrote first, ``@record`` replaces memwatch's file with its own, as it
  always does.
* The exception goes on unchanged: the file is one more place that tells of it.
* torchelastic takes the failure with the smallest timestamp for the root cause, and timestamps
  are whole seconds. A failure memwatch knows to be a consequence (``peer_failure``, the
  launcher's SIGTERM) is stamped with the next whole second, so that when both fall within one
  second the rank that failed first is still the root cause.
* Redacted, like everything that leaves the process; bounded (the traceback's last 64 KiB).

Example::

    >>> import json, os
    >>> path = os.path.join(tmp, "error.json")
    >>> write_error_file("/runs/oom/b1", "exception", ValueError("bad"), "other",
    ...                  env={"TORCHELASTIC_ERROR_FILE": path}, now=1700000000.5)
    True
    >>> with open(path) as f:
    ...     doc = json.load(f)["message"]
    >>> doc["message"], doc["extraInfo"]["timestamp"]
    ('ValueError: bad', '1700000000')
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from memwatch.core.oom import PEER_FAILURE
from memwatch.core.redact import redact_text

__all__ = ["ERROR_FILE_VAR", "write_error_file"]

log = logging.getLogger("memwatch")

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"
_MAX_TRACE = 64 * 1024


def write_error_file(bundle: Path | str, trigger: str, exc: BaseException | None,
                     kind: str | None, env: Mapping[str, str] | None = None,
                     now: float | None = None) -> bool:
    """Write torchelastic's error file for the failure whose bundle is ``bundle``; True when
    written. Nothing is written without ``TORCHELASTIC_ERROR_FILE``, for bundles that are not a
    failure (manual, watchdog, end of run), or over an existing file. Never raises."""
    env = os.environ if env is None else env
    path = env.get(ERROR_FILE_VAR, "")
    if not path or path == os.devnull or trigger not in ("exception", "signal"):
        return False
    try:
        if exc is not None:
            first = f"{type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if str(bundle) not in trace:  # the exception took no note
                trace += f"memwatch: diagnostic bundle written to {bundle}\n"
        else:
            first = "memwatch: stopped by a signal (the launcher stopping the job, or a " \
                    "preemption)"
            trace = f"{first}; diagnostic bundle written to {bundle}\n"
        t = time.time() if now is None else now
        late = kind == PEER_FAILURE or exc is None  # a consequence of another rank's failure
        stamp = int(math.ceil(t)) if late else int(t)
        doc = {"message": {"message": redact_text(first)[:4096], "extraInfo": {
            "py_callstack": redact_text(trace)[-_MAX_TRACE:], "timestamp": str(stamp)}}}
        text = json.dumps(doc)
        _create(path, text, replace=_ours.get(path))
        _ours[path] = text
        return True
    except FileExistsError:
        return False  # torchelastic's @record told the story already
    except Exception as e:  # noqa: BLE001
        log.info("memwatch: %s not written (%s: %s)", ERROR_FILE_VAR, type(e).__name__, e)
        return False


def _create(path: str, text: str, replace: str | None = None) -> None:
    """``text`` at ``path``, whole, unless ``path`` exists (FileExistsError) with other content
    than ``replace`` (what this process wrote there before: a later failure's story replaces
    an earlier one's, the one the process recovered from; a file anyone else wrote stays)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".memwatch-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            if replace is None or _read(path, len(replace) + 1) != replace:
                raise
            os.replace(tmp, path)  # our own earlier file, unchanged since: replaced whole
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _read(path: str, limit: int) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


#: What this process last wrote at each error file (replaced only while it is still that).
_ours: dict[str, str] = {}
