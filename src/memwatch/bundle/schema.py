"""The types of the fields a bundle's documents hold, checked when a bundle is read.

A bundle can come from anyone; its renderers (``memwatch inspect``, ``report``, ``ls``) read
fields by name. A field of the wrong type (``"numbers": [1, 2]`` where an object is written, a
``world_size`` of 10**12) is refused here with one line naming the file and the field, instead
of a traceback (or a loop over 10**12 ranks) further on. Unknown fields are allowed (a newer
memwatch may add some); known ones must have their type. Each document's size is capped too
(:data:`MAX_BYTES`).

Example::

    >>> from memwatch.bundle.schema import check
    >>> check("exception.json", {"type": "RuntimeError", "numbers": {"free": 1}})
    >>> check("exception.json", {"type": "RuntimeError", "numbers": [1, 2]})
    "field 'numbers' should be an object, not a list"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["EPOCH", "FINDING", "MAX_BYTES", "MAX_KEYS", "MAX_OTHER_BYTES", "MAX_RANKS",
           "MAX_UNIX", "TIME", "DictOf", "ListOf", "Obj", "T", "check", "check_record"]

MIB = 1 << 20
#: Largest size read of each file (a bundle memwatch writes is far below each cap).
MAX_BYTES: dict[str, int] = {
    "manifest.json": 1 * MIB, "environment.json": 1 * MIB, "exception.json": 4 * MIB,
    "memory.json": 4 * MIB, "findings.json": 16 * MIB, "census.json": 16 * MIB,
    "allocator.json": 16 * MIB, "ranks.json": 32 * MIB, "snapshot.pickle": 256 * MIB,
}
#: Cap of a JSON file the table does not name.
MAX_OTHER_BYTES = 16 * MIB
#: Largest world size (and rank + 1) accepted: a job of more ranks than this is not real.
MAX_RANKS = 1 << 20
#: Latest wall-clock time accepted (unix seconds, the year 5138): later ones are no date.
MAX_UNIX = 1e11
#: Most metric keys a timeline header may name (memwatch records a few dozen): each is a
#: column every sample is read into.
MAX_KEYS = 4096

_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
          float: "a number", bool: "true/false", type(None): "null"}
_NUM = (int, float)
_NONE = type(None)


class _Spec:
    def error(self, v: Any) -> str | None:
        raise NotImplementedError


class T(_Spec):
    """One of some JSON types (``int`` accepts no ``bool``; ``float`` accepts ints too), a
    number within ``lo``..``hi`` when they are given."""

    def __init__(self, *types: type, lo: float | None = None, hi: float | None = None) -> None:
        self.types = types
        self.lo, self.hi = lo, hi

    def error(self, v: Any) -> str | None:
        ok = any(isinstance(v, t) and not (t is int and isinstance(v, bool)) for t in self.types)
        if not ok and float in self.types and isinstance(v, int) and not isinstance(v, bool):
            ok = True
        if not ok:
            want = " or ".join(_NAMES.get(t, t.__name__) for t in self.types)
            return f"should be {want}, not {_NAMES.get(type(v), type(v).__name__)}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
                return f"is {str(v)[:40]}, outside {self.lo}..{self.hi}"
        return None


class ListOf(_Spec):
    def __init__(self, item: _Spec, none: bool = False, most: int | None = None) -> None:
        self.item, self.none, self.most = item, none, most

    def error(self, v: Any) -> str | None:
        if v is None and self.none:
            return None
        if not isinstance(v, list):
            return T(list).error(v)
        if self.most is not None and len(v) > self.most:
            return f"holds {len(v)} items, over {self.most}"
        for i, x in enumerate(v):
            e = self.item.error(x)
            if e:
                return f"[{i}] {e}"
        return None


class DictOf(_Spec):
    def __init__(self, value: _Spec, none: bool = False) -> None:
        self.value, self.none = value, none

    def error(self, v: Any) -> str | None:
        if v is None and self.none:
            return None
        if not isinstance(v, dict):
            return T(dict).error(v)
        for k, x in v.items():
            e = self.value.error(x)
            if e:
                return f"[{k!r}] {e}"
        return None


class Obj(_Spec):
    def __init__(self, fields: Mapping[str, _Spec], none: bool = False) -> None:
        self.fields, self.none = fields, none

    def error(self, v: Any) -> str | None:
        if v is None and self.none:
            return None
        if not isinstance(v, dict):
            return T(dict).error(v)
        for name, spec in self.fields.items():
            if name in v:
                e = spec.error(v[name])
                if e:
                    return f"field {name!r} {e}"
        return None


_S0 = T(str, _NONE)
_N0 = T(float, _NONE)
_I0 = T(int, _NONE)
_RANK = T(int, _NONE, lo=0, hi=MAX_RANKS)
_WORLD = T(int, _NONE, lo=1, hi=MAX_RANKS)
#: A wall-clock time (unix seconds) a reader turns into a date: years 1970 to 5138.
TIME = T(float, _NONE, lo=0, hi=MAX_UNIX)

FINDING = Obj({
    "kind": _S0, "metric": _S0, "severity": _S0, "message": _S0, "culprit": _S0,
    "bytes_per_step": _N0, "steps_to_oom": _N0, "seconds_to_oom": _N0,
    "suggestions": ListOf(T(str), none=True), "evidence": T(dict, _NONE), "epoch": _I0,
    "step": _I0, "rank": _RANK, "stage": _S0, "check": _I0, "rule": _S0,
})
_GROUP = Obj({
    "device": _S0, "dtype": _S0, "shape": ListOf(T(int, str), none=True),
    "requires_grad": T(bool, _NONE), "grad_fn": _S0, "count": T(float, _NONE),
    "bytes": _N0, "holder": _S0, "graph_nodes": _N0, "graph_bytes": _N0,
})

_FLOATS = DictOf(T(float, _NONE), none=True)
# One rank's epoch-end summary in ranks.json (memwatch.runtime.exchange.rank_payload).
_RANK_SUMMARY = Obj({
    "rank": _RANK, "local_rank": _RANK, "host": _S0, "epoch": _I0, "step": _I0, "time": TIME,
    "floor": _FLOATS, "peak": _FLOATS, "limits": _FLOATS, "findings": ListOf(FINDING, none=True),
}, none=True)

SCHEMAS: dict[str, _Spec] = {
    "manifest.json": Obj({
        "schema_version": T(int), "name": _S0, "memwatch_version": _S0, "created_utc": _S0,
        "created_unix": TIME, "trigger": _S0, "reason": _S0,
        "classification": T(str, dict, _NONE), "exception_type": _S0, "pre_unwind": T(
            bool, _NONE), "host": _S0, "pid": _I0, "rank": _RANK, "local_rank": _RANK,
        "world_size": _WORLD, "job": Obj({"id": _S0, "source": _S0, "attempt": _I0},
                                         none=True),
        "step": _I0, "epoch": _I0, "files": DictOf(T(int, lo=0)), "bytes": T(int, _NONE, lo=0),
        "trimmed": ListOf(Obj({"file": _S0, "bytes": _N0}), none=True),
        "errors": DictOf(T(str), none=True), "complete": T(bool), "run_id": _S0,
    }),
    "exception.json": Obj({
        "type": _S0, "message": _S0, "classification": _S0, "matched": T(dict, _NONE),
        "numbers": DictOf(T(float, _NONE), none=True), "notes": ListOf(T(str), none=True),
        "traceback": _S0, "note": _S0,
    }),
    "memory.json": Obj({
        "latest": DictOf(T(float, _NONE), none=True), "limits": DictOf(T(float, _NONE),
                                                                         none=True),
        "observer": DictOf(T(float, _NONE), none=True), "host_rss_at_write": _N0,
        "address_space": DictOf(T(float, _NONE), none=True), "captured_at_unix": TIME,
        "captured_on_thread": _S0, "capture_errors": T(dict, _NONE), "cgroup": T(dict, _NONE),
    }),
    "findings.json": ListOf(FINDING),
    "census.json": Obj({"groups": ListOf(_GROUP, none=True),
                        "top": ListOf(_GROUP, none=True),
                        "error": _S0, "total_bytes": _N0}),
    "environment.json": Obj({"env": DictOf(T(str, float, bool, _NONE), none=True),
                             "argv": ListOf(T(str), none=True), "rank": T(dict, _NONE)}),
    "allocator.json": Obj({"memory_stats": T(dict, _NONE), "segments_summary": T(dict, _NONE)}),
    "ranks.json": Obj({"world_size": _WORLD, "job": T(dict, _NONE), "epoch": _I0,
                       "missing": ListOf(T(int), none=True), "exchange_error": _S0,
                       "summaries": ListOf(_RANK_SUMMARY, none=True)}),
}
# timeline.jsonl, one record per line
#: An epoch summary (a timeline record, an export's epoch row).
EPOCH = Obj({"epoch": _I0, "end_step": _I0, "start_step": _I0})
_RECORDS: dict[str, _Spec] = {
    "header": Obj({"keys": ListOf(T(str), most=MAX_KEYS), "samples": _I0, "wall_offset": _N0}),
    "sample": Obj({"step": T(int), "t": _N0}),
    "epoch": EPOCH,
}


def check(fname: str, doc: Any) -> str | None:
    """What is wrong with document ``fname`` (None: nothing; documents not described pass)."""
    spec = SCHEMAS.get(fname)
    if spec is None:
        return None
    if isinstance(spec, ListOf) and not isinstance(doc, list):
        return "should be a list, not " + _NAMES.get(type(doc), type(doc).__name__)
    if isinstance(spec, Obj) and not isinstance(doc, dict):
        return "should be an object, not " + _NAMES.get(type(doc), type(doc).__name__)
    return spec.error(doc)


def check_record(rec: Any) -> str | None:
    """What is wrong with one ``timeline.jsonl`` record (None: nothing). A sample's metric
    values must be numbers or null."""
    if not isinstance(rec, dict):
        return "should be an object, not " + _NAMES.get(type(rec), type(rec).__name__)
    kind = rec.get("type")
    spec = _RECORDS.get(kind) if isinstance(kind, str) else None
    if spec is not None:
        e = spec.error(rec)
        if e:
            return e
    if kind == "sample":
        for k, v in rec.items():
            if k not in ("type", "step", "t") and v is not None and (
                    not isinstance(v, (int, float)) or isinstance(v, bool)):
                return f"field {k!r} should be a number or null"
    return None
