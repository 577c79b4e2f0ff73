"""What a finished run leaves in its ``out_dir`` beside its bundles: ``summary.json`` (this
module's format, versioned like a bundle's manifest) and ``report.html``.

Every training session writes both when it closes (:mod:`memwatch.session.answer`), so a job
scheduler, a CI step or a notebook can read the run's answer without parsing a console:
its steps and checks, its current verdicts (each with its holder and severity), the bundles it
wrote and how it ended. ``memwatch ls`` lists such runs beside bundles, ``memwatch inspect`` and
``memwatch report`` show them. The fields are in ``docs/bundle-format.md``.

A ``summary.json`` may come from anyone, like a bundle: :func:`read_summary` reads at most
:data:`MAX_SUMMARY_BYTES`, never through a symlink, parses JSON with a nesting cap, checks the
known fields' types, refuses another ``schema_version`` with a one-line error and strips strings
of terminal control characters.

Example::

    >>> from pathlib import Path
    >>> from memwatch.bundle.run_summary import read_summary, write_summary
    >>> path = write_summary(Path(tmp), {"steps": 1200, "checks": 4, "verdicts": []})
    >>> doc = read_summary(path)
    >>> doc["schema_version"], doc["steps"], path.name
    (1, 1200, 'summary.json')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memwatch._version import __version__
from memwatch.bundle.schema import FINDING, DictOf, ListOf, Obj, T
from memwatch.core.errors import BundleError
from memwatch.core.findings import Finding
from memwatch.core.safefs import open_dir, read_bounded, write_atomic
from memwatch.core.untrusted import loads_json, sanitize

__all__ = ["KIND", "MAX_SUMMARY_BYTES", "SUMMARY_FILE", "SUMMARY_VERSION", "VERDICT_FIELDS",
           "read_summary", "verdict_entry", "write_summary"]

#: The file's name in an ``out_dir``.
SUMMARY_FILE = "summary.json"
#: Its schema version: a reader refuses other versions (a newer memwatch may write a newer one).
SUMMARY_VERSION = 1
#: What ``kind`` says: a JSON file of that name written by something else is not read as one.
KIND = "memwatch-run"
#: Largest ``summary.json`` read (one memwatch writes is a few KiB; its verdicts are bounded).
MAX_SUMMARY_BYTES = 4 << 20
#: Verdicts kept in one summary (the current ones: one per belief).
MAX_VERDICTS = 200

_S0 = T(str, type(None))
_I0 = T(int, type(None))
_N0 = T(float, type(None))
_VERDICT = Obj({**FINDING.fields, "holder": _S0})
_SCHEMA = Obj({
    "schema_version": T(int), "kind": _S0, "memwatch_version": _S0, "run_id": _S0,
    "started_utc": _S0, "ended_utc": _S0, "ended_unix": _N0, "host": _S0, "pid": _I0,
    "rank": _I0, "local_rank": _I0, "world_size": _I0, "job": T(dict, type(None)),
    "stage": _S0, "steps": _I0, "epochs": _I0, "checks": _I0,
    "verdict": _S0, "verdicts": ListOf(_VERDICT), "findings_total": _I0,
    "rank_verdicts": ListOf(_VERDICT, none=True),
    "bundles": ListOf(Obj({"path": _S0, "trigger": _S0, "classification": _S0}), none=True),
    "exit": Obj({"status": _S0, "exception": _S0, "bundle": _S0}, none=True),
    "report": _S0, "peaks": DictOf(_N0, none=True), "limits": DictOf(_N0, none=True),
    "disabled": DictOf(_S0, none=True),
})


#: A verdict's fields in ``summary.json`` (its evidence stays in the report and the bundles).
VERDICT_FIELDS = ("kind", "metric", "severity", "holder", "culprit", "bytes_per_step",
                  "steps_to_oom", "seconds_to_oom", "message", "suggestions", "step", "check",
                  "rank", "stage", "rule")


def verdict_entry(f: Finding, epochs: bool = True) -> dict[str, Any]:
    """One verdict of ``summary.json``: the finding's fields, its holder's name (the census's
    path to the container, when it named one) and, in a run with epochs, its epoch."""
    d = f.to_dict()
    holder = f.evidence.get("holder")
    d["holder"] = str(holder) if holder else None
    out = {k: d.get(k) for k in VERDICT_FIELDS}
    if epochs:
        out["epoch"] = d.get("epoch")
    return out


def write_summary(out_dir: Path, doc: Mapping[str, Any], share: str = "private") -> Path:
    """Write ``doc`` (its ``schema_version``, ``kind`` and ``memwatch_version`` added) as
    ``<out_dir>/summary.json``, atomically, never through a symlink, private unless
    ``share="group"``. Raises ``OSError`` when it cannot."""
    full = {"schema_version": SUMMARY_VERSION, "kind": KIND, "memwatch_version": __version__,
            **doc}
    data = json.dumps(full, indent=1, allow_nan=False, default=str).encode()
    fd = open_dir(out_dir, create=True, share=share)
    try:
        write_atomic(fd, SUMMARY_FILE, data, share=share)
    finally:
        os.close(fd)
    return Path(out_dir) / SUMMARY_FILE


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ``summary.json`` (or the one in the folder ``path``), validated; raises
    :class:`memwatch.core.errors.BundleError` with one line saying what is wrong."""
    p = Path(path)
    if p.name != SUMMARY_FILE:
        p = p / SUMMARY_FILE
    try:
        data = read_bounded(p, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        raise BundleError(f"{p.parent}: no {SUMMARY_FILE} (no run ended there)") from None
    except OSError as e:  # UnsafePathError says what it refused
        raise BundleError(f"{p}: cannot read ({e})") from None
    try:
        doc = loads_json(data, str(p))
    except ValueError as e:
        raise BundleError(f"{e} (corrupted or truncated JSON)") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BundleError(f"{p}: not a memwatch run summary")
    version = doc.get("schema_version")
    if version != SUMMARY_VERSION:
        raise BundleError(f"{p}: unknown summary schema_version {repr(version)[:40]} (this "
                          f"memwatch {__version__} reads version {SUMMARY_VERSION}; upgrade "
                          "memwatch to read newer summaries)")
    err = _SCHEMA.error(doc)
    if err:
        raise BundleError(f"{p}: {err} (not a memwatch run summary, or modified)")
    return sanitize(doc)  # type: ignore[no-any-return]
