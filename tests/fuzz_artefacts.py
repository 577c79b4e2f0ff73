"""Real memwatch artefacts, and the mutations a fuzzer makes of them.

:func:`make_artefacts` runs two tiny real sessions (FakeDevice, three epochs of a planted leak):
one ends in an OOM bundle (census, allocator snapshot, timeline), the other writes a
``JsonlSink`` log small enough to rotate (``events.jsonl`` and ``events.jsonl.1`` ...), a CSV
and a JSON export of its ring (``timeline.csv``, ``timeline.json``), and leaves a copy of its
black-box record as it stood while the run was alive. Everything the property tests
(``tests/test_fuzz_readers.py``) and ``benchmarks/bench_fuzz_readers.py`` feed to the readers
starts from these bytes.

The mutations are plain functions of a ``random.Random`` (the property tests draw its seed from
Hypothesis, the benchmark from a counter), so one mutation is one reproducible seed:

* :func:`mutate_doc` swaps one value of a parsed document for another type, a huge or
  non-finite number (written as JSON would never write it: ``NaN``, ``1e999``, 401 digits), a
  deep nest, a lone surrogate or a long string;
* :func:`mutate_bytes` flips, cuts, duplicates or inserts bytes (invalid UTF-8, control
  characters);
* :func:`plant` puts a symlink (to ``/dev/zero``, outside, inside), a FIFO, a directory or a
  sparse 8 GiB file where a regular file should be.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import pickle
import random
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import memwatch
from hostile_bundles import real_bundle
from memwatch.bundle import find_bundles, open_bundle
from memwatch.bundle.blackbox import find_records, judge, read_record, summary_line
from memwatch.bundle.documents import segments_summary
from memwatch.bundle.export import to_csv, to_json
from memwatch.cli import CAUGHT_MALFORMED, main
from memwatch.core import safepickle
from memwatch.core.errors import BundleError, MemwatchError, UnsafePickleError
from memwatch.report.data import from_bundle
from memwatch.report.exports import from_export
from memwatch.report.html import render, write_html
from memwatch.report.jobs import compare, group_jobs, render_comparison
from memwatch.report.summary import summarize
from memwatch.report.terminal import print_summary
from memwatch.sinks import JsonlSink
from memwatch.testing import FakeDevice

MIB = 1 << 20
#: Text of a file outside the artefacts: a reader must never show it.
MARK = "OUTSIDE-THE-ARTEFACT-MARK"


@dataclass(frozen=True)
class Artefacts:
    """Where the real artefacts are (read-only: copy before mutating)."""

    root: Path
    bundle: Path
    log: Path  # events.jsonl; its rotated files beside it
    csv: Path
    json: Path
    record: Path  # a black-box record, in <root>/rec/blackbox/

    def rotated(self) -> list[Path]:
        return sorted(self.log.parent.glob(self.log.name + ".*"))


def make_artefacts(root: Path) -> Artefacts:
    """Run the two real sessions under ``root``; returns where their files are."""
    bundle = real_bundle(root / "oom")
    logdir = root / "log"
    sink = JsonlSink(logdir / "events.jsonl", max_bytes=8 * 1024, max_files=4)
    dev = FakeDevice(total_bytes=1 << 30)
    held = []
    rec_dir = root / "rec" / "blackbox"
    rec_dir.mkdir(parents=True)
    # The black box is rewritten by the background sampler: a short period, and a wait for a
    # rewrite that holds the findings, gives a record with samples and findings in it.
    with memwatch.watch(device=dev, workers=False, out_dir=root / "run", signals=False,
                        sinks=[sink], log_every_n_steps=1, recorder=False, interval_s=0.02,
                        blackbox_every_s=0.02) as mw:
        for _epoch in range(3):
            for _ in range(12):
                held.append(dev.malloc(2 * MIB))
                mw.step()
            mw.end_epoch()
            time.sleep(0.05)
        to_csv(mw, logdir / "timeline.csv")
        to_json(mw, logdir / "timeline.json")
        live = sorted((root / "run" / "blackbox").glob("*.json"))
        assert live, "no black-box record while the run was alive"
        deadline = time.monotonic() + 5.0
        while b'"findings":[]' in live[0].read_bytes() and time.monotonic() < deadline:
            time.sleep(0.02)
        record = rec_dir / live[0].name
        shutil.copyfile(live[0], record)
    return Artefacts(root=root, bundle=bundle, log=logdir / "events.jsonl",
                     csv=logdir / "timeline.csv", json=logdir / "timeline.json",
                     record=record)


# --------------------------------------------------------------------------- choices
class Chooser(Protocol):
    """Where a mutation's choices come from: Hypothesis (the property tests, which shrink a
    failing case to its smallest choices) or a seeded ``random.Random`` (the benchmark)."""

    def choice(self, seq: Sequence[Any]) -> Any: ...

    def integer(self, lo: int, hi: int) -> int: ...

    def chance(self, percent: int) -> bool: ...

    def value(self) -> Any: ...


class RandomChooser:
    """A :class:`Chooser` of a seeded ``random.Random``."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def choice(self, seq: Sequence[Any]) -> Any:
        return self.r.choice(seq)

    def integer(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def chance(self, percent: int) -> bool:
        return self.r.randrange(100) < percent

    def value(self) -> Any:
        if self.r.randrange(4):
            return self.r.choice(VALUES)
        return _random_json(self.r, 3)


def _random_json(r: random.Random, depth: int) -> Any:
    k = r.randrange(9 if depth else 6)
    if k == 0:
        return r.choice([None, True, False])
    if k == 1:
        return r.randint(-2**70, 2**70)
    if k == 2:
        return r.choice([r.uniform(-1e300, 1e300), r.random(), float(r.randint(0, 10**6))])
    if k in (3, 4, 5):
        return "".join(chr(r.choice([r.randrange(32, 127), r.randrange(0, 0x110000)]))
                       for _ in range(r.randrange(12)))
    if k in (6, 7):
        return [_random_json(r, depth - 1) for _ in range(r.randrange(4))]
    return {str(_random_json(r, 0)): _random_json(r, depth - 1) for _ in range(r.randrange(4))}


# --------------------------------------------------------------------------- values
def deep(n: int, kind: str = "list") -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v] if kind == "list" else {"a": v}
    return v


class Raw:
    """A number written as JSON text memwatch never writes (``NaN``, ``1e999``, 401 digits)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:20]!r})"


BIG = "9" * 401
RAW_NUMBERS = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-1e999"),
               Raw(BIG), Raw("-" + BIG), Raw("1" + "0" * 5000), Raw("1e308"), Raw("-0.0")]
#: Hostile values a document's value is swapped for.
VALUES: list[Any] = [None, True, False, -1, 0, 2**63, -2**63, 2**64 + 1, 10**30, 1e308, -1e308,
                     5e-324, 1.5, 1e11, -1e11, "", "x", "\x1b[2J\x07", "\udcff", "a\ud800b",
                     "\u202e", "\u00b2", "x" * 70_000, [], {}, [1, "a", None],
                     {"a": [{"b": 1}]}, [[]], {"size": {}}, ["host.rss"], -2**40, *RAW_NUMBERS]
#: Keys a document's key is renamed to.
KEYS = ["\udcff", "host.\x1b[2J", "x" * 5000, "rank", "step", "event", "type", "metrics",
        "host.rss", "memwatch/host.rss_gib", "end_step", "findings", "samples", "keys"]


def _encode(doc: Any) -> str:
    """JSON text of ``doc``: :class:`Raw` values as their text, lone surrogates escaped (as
    ``json.dumps`` writes them), nests deeper than the encoder allows spliced in as text."""
    holes: list[str] = []

    def swap(o: Any, depth: int = 0) -> Any:
        if isinstance(o, Raw):
            holes.append(o.text)
            return f"\x00HOLE{len(holes) - 1}\x00"
        if depth > 200:
            holes.append("[" * 3000 + "]" * 3000)
            return f"\x00HOLE{len(holes) - 1}\x00"
        if isinstance(o, dict):
            return {k: swap(v, depth + 1) for k, v in o.items()}
        if isinstance(o, list):
            return [swap(v, depth + 1) for v in o]
        return o

    text = json.dumps(swap(doc))
    for i, h in enumerate(holes):
        text = text.replace(f'"\\u0000HOLE{i}\\u0000"', h)
    return text


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where a value can be swapped: the deepest first, the document itself last (Hypothesis
    tries the first choices first)."""
    out: list[tuple[Any, ...]] = []
    if len(prefix) <= 8:  # not into a deep nest an earlier mutation made
        if isinstance(doc, dict):
            for k, v in list(doc.items())[:40]:
                out += _paths(v, (*prefix, k))
        elif isinstance(doc, list):
            for i, v in enumerate(doc[:20]):
                out += _paths(v, (*prefix, i))
    return [*out, prefix]


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_doc(c: Chooser, doc: Any) -> Any:
    """``doc`` (parsed JSON or a snapshot) with one value swapped for a hostile one, or one key
    renamed (see the module doc)."""
    path = c.choice(_paths(doc))
    op = c.integer(0, 9)
    if op == 0:
        value: Any = deep(c.choice([65, 70, 1000, 5000]), c.choice(["list", "dict"]))
    elif op == 1 and path and isinstance(path[-1], str):
        parent = _at(doc, path[:-1])
        parent[c.choice(KEYS)] = parent.pop(path[-1])
        return doc
    elif op == 2:  # the same value, of another type
        old = _at(doc, path)
        try:
            value = (str(old) if not isinstance(old, str) else
                     [old] if c.chance(50) else {"v": old})
        except RecursionError:  # str() of a nest an earlier mutation made deep
            value = "deep"
    else:
        value = copy.deepcopy(c.value())  # VALUES' lists and dicts are shared: never edited
    if not path:
        return value
    _at(doc, path[:-1])[path[-1]] = value
    return doc


def mutate_bytes(c: Chooser, data: bytes) -> bytes:
    b = bytearray(data)
    op = c.integer(0, 6)
    if op == 0 and b:  # flip bytes
        for _ in range(c.integer(1, 8)):
            b[c.integer(0, len(b) - 1)] = c.integer(0, 255)
    elif op == 1:  # cut (a torn write)
        b = b[: c.integer(0, len(b))]
    elif op == 2:  # insert control characters or invalid UTF-8
        i = c.integer(0, len(b))
        b[i:i] = c.choice([b"\x1b]0;t\x07", b"\xff\xfe", b"\x00", b"\x9b2J", b"\r",
                           b"\xed\xa0\x80", b"\xc3", b'"\\udcff"', b"\n", b"\xef\xbb\xbf"])
    elif op == 3 and b:  # duplicate a chunk
        i = c.integer(0, len(b) - 1)
        b[i:i] = b[i:i + c.integer(1, 200)] * c.integer(1, 50)
    elif op == 4:  # a deep nest spliced in
        i = c.integer(0, len(b))
        k = c.choice([70, 1000, 100_000])
        b[i:i] = b"[" * k + b"]" * k
    elif op == 5:  # a huge number spliced in
        i = c.integer(0, len(b))
        b[i:i] = c.choice([BIG.encode(), b"1e999", b"NaN", b"-Infinity", b"1" * 5000])
    else:  # empty
        b = bytearray()
    return bytes(b)


def _parse(data: bytes) -> Any:
    """Parsed JSON (the mutator's own reading), None when it does not parse."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def mutate_json_file(c: Chooser, f: Path) -> str:
    """Mutate a JSON file (a value when it parses, else its bytes); returns what was done."""
    data = f.read_bytes()
    if c.chance(70):
        doc = _parse(data)
        if doc is not None:
            for _ in range(c.choice([1, 1, 2, 3])):
                doc = mutate_doc(c, doc)
            f.write_bytes(_encode(doc).encode("utf-8", "surrogatepass"))
            return "value"
    f.write_bytes(mutate_bytes(c, data))
    return "bytes"


def mutate_lines_file(c: Chooser, f: Path) -> str:
    """Mutate some lines of a JSON-lines file; returns what was done."""
    lines = f.read_bytes().splitlines()
    if not lines or c.chance(25):
        f.write_bytes(mutate_bytes(c, f.read_bytes()))
        return "bytes"
    for _ in range(c.choice([1, 1, 2, 4])):
        i = c.integer(0, len(lines) - 1)
        doc = _parse(lines[i])
        if doc is None:
            lines[i] = mutate_bytes(c, lines[i])
            continue
        lines[i] = _encode(mutate_doc(c, doc)).encode("utf-8", "surrogatepass")
    f.write_bytes(b"\n".join(lines) + b"\n")
    return "lines"


CSV_CELLS = [BIG, "-" + BIG, "1e999", "nan", "inf", "-0", "\u00b2", "\x00", '"', '"a\nb"',
             "x" * 200_000, "1" * 5000, "\udcff", "host.\x1b[2J", ",,,,,,,,", "0x10", "1_000"]


def mutate_csv_file(c: Chooser, f: Path) -> str:
    """Swap some cells (or the header's) of a CSV export for hostile ones."""
    lines = f.read_bytes().split(b"\n")
    if c.chance(25):
        f.write_bytes(mutate_bytes(c, f.read_bytes()))
        return "bytes"
    for _ in range(c.choice([1, 2, 4])):
        i = c.integer(0, max(0, len(lines) - 2))
        cells = lines[i].split(b",")
        j = c.integer(0, len(cells) - 1)
        cell = c.choice(CSV_CELLS) if c.chance(80) else str(c.value())
        cells[j] = cell.encode("utf-8", "surrogatepass")
        lines[i] = b",".join(cells)
    f.write_bytes(b"\n".join(lines))
    return "cells"


def outside(root: Path) -> Path:
    f = root / "outside.json"
    if not f.exists():
        f.write_text(json.dumps({"event": "finding", "kind": "leak", "message": MARK,
                                 "type": "Secret", "numbers": {}}))
    return f


PLANTS = ("symlink /dev/zero", "symlink outside", "symlink inside", "fifo", "directory",
          "sparse 8 GiB", "removed")


def plant(kind: str, f: Path, root: Path) -> str:
    """Replace ``f`` with something that is not a regular file of its own (see
    :data:`PLANTS`); returns which."""
    sibling = next((q for q in sorted(f.parent.iterdir()) if q != f and q.is_file()
                    and not q.is_symlink()), None)
    if f.is_dir() and not f.is_symlink():
        shutil.rmtree(f)
    elif os.path.lexists(f):
        f.unlink()
    if kind == "symlink /dev/zero":
        f.symlink_to("/dev/zero")
    elif kind == "symlink outside":
        f.symlink_to(outside(root))
    elif kind == "symlink inside" and sibling is not None:
        f.symlink_to(sibling)
    elif kind == "fifo":
        os.mkfifo(f)
    elif kind == "directory":
        f.mkdir()
    elif kind == "sparse 8 GiB":
        with open(f, "wb") as g:
            g.truncate(8 << 30)
    return kind


# --------------------------------------------------------------------------- cases
#: Each reader the fuzz tests cover.
READERS = ("bundle", "record", "snapshot", "jsonl", "csv", "json")
# (Hypothesis tries the first choices first: the manifest, whose mutations refuse the whole
# bundle, comes last.)
_BUNDLE_FILES = ("environment.json", "findings.json", "census.json", "exception.json",
                 "memory.json", "allocator.json", "timeline.jsonl", "snapshot.pickle",
                 "manifest.json")


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch /tmp/memwatch-fuzz-pwned",))


def _mutate_pickle(c: Chooser, f: Path) -> str:
    op = c.integer(0, 5)
    if op == 0:
        f.write_bytes(mutate_bytes(c, f.read_bytes()))
        return "pickle bytes"
    if op == 1:
        f.write_bytes(pickle.dumps({"segments": [_Evil()]}))
        return "pickle runs os.system"
    try:  # the real artefact, written by this test (or by an earlier mutation of this case)
        doc = pickle.loads(f.read_bytes())  # noqa: S301
    except Exception:  # noqa: BLE001 - an earlier mutation broke it: its bytes, then
        f.write_bytes(mutate_bytes(c, f.read_bytes()))
        return "pickle bytes"
    for _ in range(c.choice([1, 2, 3])):
        doc = mutate_doc(c, doc)
    if op == 2:  # one container shared: a small file that would expand
        blocks = [{"size": 512, "state": "active_allocated"}] * c.integer(2, 3000)
        doc = {"segments": [{"total_size": 1 << 20, "blocks": blocks}] * c.integer(2, 3000)}
    try:
        f.write_bytes(pickle.dumps(doc, protocol=c.integer(0, 5)))
    except RecursionError:  # deeper than the pickler goes: a deep nest by hand
        n = 100_000
        f.write_bytes(b"\x80\x04" + b"]" * n + b"a" * (n - 1) + b".")
    return "pickle value"


def _fix_size(b: Path, name: str) -> None:
    """Keep the manifest's size of ``name`` right: the content is what the reader judges."""
    m = _parse((b / "manifest.json").read_bytes()) if _small(b / "manifest.json") else None
    try:
        m["files"][name] = os.lstat(b / name).st_size if os.path.lexists(b / name) else 0
        (b / "manifest.json").write_text(json.dumps(m))
    except (ValueError, KeyError, TypeError, OSError, RecursionError):
        pass


def _mutate_file(c: Chooser, f: Path, root: Path, kind: str) -> str:
    if c.chance(12):
        return plant(c.choice(PLANTS), f, root)
    if not _small(f):  # a FIFO, a link, a directory, a sparse 8 GiB file an earlier one planted
        return "left"
    if kind == "pickle":
        return _mutate_pickle(c, f)
    if kind == "lines":
        return mutate_lines_file(c, f)
    if kind == "csv":
        return mutate_csv_file(c, f)
    return mutate_json_file(c, f)


def _small(f: Path) -> bool:
    """Whether ``f`` is a regular file the mutator itself may read (not what a plant left)."""
    try:
        st = os.lstat(f)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size < 64 << 20


def _kind(name: str) -> str:
    return ("pickle" if name.endswith(".pickle") else "csv" if name.endswith(".csv") else
            "lines" if name.endswith(".jsonl") or ".jsonl." in name else "json")


def make_case(reader: str, art: Artefacts, work: Path, c: Chooser) -> tuple[Path, str]:
    """A mutated copy of the real artefact ``reader`` reads, under ``work``; returns what the
    reader is given and a description of the mutations."""
    what: list[str] = []
    if reader == "bundle":
        b = work / "out" / "oom" / art.bundle.name
        shutil.copytree(art.bundle, b)
        for _ in range(1 + c.chance(30) + c.chance(10)):
            name = c.choice(_BUNDLE_FILES)
            what.append(f"{name}: {_mutate_file(c, b / name, work, _kind(name))}")
            if name != "manifest.json" and c.chance(90):
                _fix_size(b, name)
        return b, "; ".join(what)
    if reader == "record":
        d = work / "out" / "blackbox"
        d.mkdir(parents=True)
        f = d / art.record.name
        shutil.copyfile(art.record, f)
        return f, _mutate_file(c, f, work, "json")
    if reader == "snapshot":
        f = work / "snapshot.pickle"
        shutil.copyfile(art.bundle / "snapshot.pickle", f)
        return f, _mutate_file(c, f, work, "pickle")
    src = {"jsonl": art.log, "csv": art.csv, "json": art.json}[reader]
    f = work / src.name
    for q in [src, *(art.rotated() if reader == "jsonl" else [])]:
        shutil.copyfile(q, work / q.name)
    names = sorted(q.name for q in work.iterdir())
    for _ in range(1 + c.chance(30)):
        if reader == "jsonl" and c.chance(15):  # something planted beside the log
            beside = work / f"{f.name}.{c.choice(['7', '12', '0', '²', '٣', '1x', ''])}"
            what.append(f"beside {beside.name}: {plant(c.choice(PLANTS), beside, work)}")
            continue
        name = c.choice(names)
        what.append(f"{name}: {_mutate_file(c, work / name, work, _kind(name))}")
    return f, "; ".join(what)


# --------------------------------------------------------------------------- readers
def read(reader: str, target: Path, work: Path) -> str:
    """Give ``target`` to every in-process reader of ``reader`` and to what renders their
    result; returns ``"result"`` when all of them gave one, ``"refused"`` when one refused with
    the documented exception (:class:`memwatch.core.errors.BundleError` for a bundle or
    snapshot, :class:`~memwatch.core.errors.MemwatchError` for an export, a one-line
    ``ValueError`` naming the file for a black-box record). Any other exception propagates."""
    if reader == "bundle":
        return _read_bundle(target)
    if reader == "record":
        return _read_record(target)
    if reader == "snapshot":
        try:
            segments_summary(safepickle.load(target))
        except UnsafePickleError:
            return "refused"
        return "result"
    try:
        d = from_export(target)
        write_html(render(d, plotly=""), work / "export.html")
    except MemwatchError as e:
        _one_line(e)
        return "refused"
    return "result"


def _one_line(e: BaseException) -> None:
    assert "\n" not in str(e) and str(e), repr(e)


def _read_bundle(b: Path) -> str:
    refused = False
    stages: list[Callable[[], Any]] = []
    try:
        bundle = open_bundle(b)
    except BundleError as e:
        _one_line(e)
        return "refused"
    for name in bundle.manifest.get("files") or {}:
        if name.endswith(".json"):
            stages.append(lambda n=name: bundle.read_json(n))
    stages += [
        lambda: list(bundle.timeline()),
        lambda: print_summary(summarize(bundle), file=io.StringIO(), fmt="plain"),
        lambda: segments_summary(bundle.snapshot()),
        lambda: write_html(render(from_bundle(bundle), plotly=""), b.parent / "r.html"),
        lambda: [render_comparison(compare(j)) for j in group_jobs(find_bundles(b.parent))[0]],
    ]
    for stage in stages:
        try:
            stage()
        except BundleError as e:
            _one_line(e)
            refused = True
    return "refused" if refused else "result"


def _read_record(f: Path) -> str:
    find_records(f.parent.parent)  # leaves out what it cannot read
    try:
        doc = read_record(f)
    except ValueError as e:
        _one_line(e)
        assert str(e).startswith(str(f)), e
        return "refused"
    summary_line(doc, judge(doc))
    return "result"


def _controls(text: str) -> bool:
    return any((ord(ch) < 32 and ch not in "\n\t") or 0x7F <= ord(ch) < 0xA0
               or 0xD800 <= ord(ch) < 0xE000 for ch in text)


def cli_commands(reader: str, target: Path, work: Path, report: bool) -> list[list[str]]:
    """The ``memwatch`` commands that read what ``reader`` reads."""
    if reader == "bundle":
        cmds = [["inspect", str(target)], ["ls", str(work / "out")],
                ["inspect", str(work / "out")]]
        return cmds + ([["report", str(target), "-o", str(work / "r.html")]] if report else [])
    if reader == "record":
        return [["inspect", str(target)], ["ls", str(work / "out")]]
    if reader == "snapshot":
        return []
    return [["report", str(target), "-o", str(work / "r.html")]]


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """``memwatch ARGS`` in this process: exit code 0, or 2 with one line on stderr; never the
    last resort (:data:`memwatch.cli.CAUGHT_MALFORMED`), never a control character printed.
    Returns the exit code and what was printed."""
    out, err = io.StringIO(), io.StringIO()
    before = sum(CAUGHT_MALFORMED.values())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    o, e = out.getvalue(), err.getvalue()
    assert sum(CAUGHT_MALFORMED.values()) == before, f"the CLI's last resort: {e.strip()}"
    assert rc in (0, 2), (rc, e)
    if rc == 2:
        lines = [ln for ln in e.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"memwatch {args[0]}: error:"), e
    assert not _controls(o + e), (o + e)[:500]
    return rc, o, e
