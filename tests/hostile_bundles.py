"""Real bundles made hostile, for the CLI's reader tests (``tests/cli/test_cli_hostile.py``)
and its fuzz test (``tests/cli/test_cli_fuzz.py``).

:func:`real_bundle` writes one FakeDevice OOM bundle (three epochs of timeline, a census, the
allocator's snapshot); :data:`MUTATIONS` are the hostile edits named after what they do, each
keeping the manifest's sizes consistent so that the *content* is what a reader must refuse.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import memwatch
from memwatch.testing import FakeDevice

MIB = 1 << 20
#: Text of a file outside the bundle: it must never be printed or embedded.
MARK = "OUTSIDE-THE-BUNDLE-MARK"
DEEP = "[" * 100_000 + "]" * 100_000


def real_bundle(out: Path, report: str = "none") -> Path:
    """One real OOM bundle under ``out``; returns its path."""
    dev = FakeDevice(total_bytes=256 * MIB)
    handles = []
    try:
        with memwatch.watch(device=dev, workers=False, out_dir=out, signals=False,
                            bundle_report=report) as mw:
            for _epoch in range(3):
                for _ in range(10):
                    handles.append(dev.malloc(2 * MIB))
                    mw.step()
                mw.end_epoch()
            dev.malloc(512 * MIB)
    except RuntimeError as e:
        return Path(e.memwatch_bundle)  # type: ignore[attr-defined]
    raise AssertionError("no OOM")


def manifest(b: Path) -> dict[str, Any]:
    return json.loads((b / "manifest.json").read_text())  # type: ignore[no-any-return]


def edit_manifest(b: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    m = manifest(b)
    fn(m)
    (b / "manifest.json").write_text(json.dumps(m))


def set_file(b: Path, name: str, data: bytes | str) -> None:
    """Replace a bundle file, keeping the manifest's size right."""
    raw = data.encode() if isinstance(data, str) else data
    (b / name).write_bytes(raw)
    edit_manifest(b, lambda m: m["files"].__setitem__(name, len(raw)))


def patch_json(b: Path, name: str, fn: Callable[[Any], Any]) -> None:
    doc = json.loads((b / name).read_text())
    new = fn(doc)
    set_file(b, name, json.dumps(doc if new is None else new))


def outside(b: Path) -> Path:
    """A JSON file beside the bundle's folder (someone else's), holding :data:`MARK`."""
    f = b.parent.parent / "outside.json"
    if not f.exists():
        f.write_text(json.dumps({"type": "Secret", "message": MARK, "numbers": {}}))
    return f


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch /tmp/memwatch-test-pwned",))


def _bomb() -> bytes:
    blocks = [{"size": 512, "state": "active_allocated", "frames": []}] * 3000
    seg = {"total_size": MIB, "allocated_size": 512, "blocks": blocks}
    return pickle.dumps({"segments": [seg] * 3000}, protocol=4)


def _symlink(b: Path, name: str, target: Path) -> None:
    (b / name).unlink()
    (b / name).symlink_to(target)
    edit_manifest(b, lambda m: m["files"].__setitem__(name, os.path.getsize(target)))


def _fifo(b: Path, name: str) -> None:
    (b / name).unlink()
    os.mkfifo(b / name)
    edit_manifest(b, lambda m: m["files"].__setitem__(name, 0))


#: name -> (mutation, refused): refused bundles must exit 2; the others may render (exit 0)
#: as long as nothing escapes as a traceback.
MUTATIONS: dict[str, tuple[Callable[[Path], Any], bool]] = {
    "manifest 100k-deep JSON": (lambda b: (b / "manifest.json").write_text(DEEP), True),
    "manifest not an object": (lambda b: (b / "manifest.json").write_text("[1]"), True),
    "manifest files not a table": (lambda b: edit_manifest(b, lambda m: m.update(files=[1])),
                                   True),
    "manifest 0xFF byte": (lambda b: (b / "manifest.json").write_bytes(
        (b / "manifest.json").read_bytes().replace(b'"trigger"', b'"trig\xffer"')), True),
    "manifest names a ../ path": (lambda b: edit_manifest(b, lambda m: m["files"].update(
        {"../../outside.json": os.path.getsize(outside(b))})), True),
    "manifest names an absolute path": (lambda b: edit_manifest(b, lambda m: m["files"].update(
        {str(outside(b)): os.path.getsize(outside(b))})), True),
    "manifest bytes a string": (lambda b: edit_manifest(b, lambda m: m.update(bytes="lots")),
                                True),
    "manifest world size 10**12": (lambda b: edit_manifest(b, lambda m: m.update(
        world_size=10**12, rank=5, job={"id": "j1"})), True),
    "exception.json a symlink outside": (lambda b: _symlink(b, "exception.json", outside(b)),
                                         True),
    "census.json a symlink inside": (lambda b: _symlink(b, "census.json", b / "memory.json"),
                                     True),
    "exception.json a FIFO": (lambda b: _fifo(b, "exception.json"), True),
    "exception.json 100k-deep": (lambda b: set_file(b, "exception.json", DEEP), True),
    "exception numbers a list": (lambda b: patch_json(
        b, "exception.json", lambda d: d.update(numbers=[1, 2])), True),
    "exception message an object": (lambda b: patch_json(
        b, "exception.json", lambda d: d.update(message={"a": 1})), True),
    "memory latest a list": (lambda b: patch_json(
        b, "memory.json", lambda d: d.update(latest=[1, 2])), True),
    "memory limits strings": (lambda b: patch_json(
        b, "memory.json", lambda d: d.update(limits={"host.rss": "big"})), True),
    "findings an object": (lambda b: set_file(b, "findings.json", '{"kind": "leak"}'), True),
    "finding fields wrongly typed": (lambda b: set_file(b, "findings.json", json.dumps([{
        "kind": 3, "severity": 5, "suggestions": "abc", "bytes_per_step": "lots"}])), True),
    "census groups wrongly typed": (lambda b: set_file(b, "census.json", json.dumps(
        {"groups": [{"shape": 5, "bytes": "x"}]})), True),
    "timeline records wrongly typed": (lambda b: set_file(b, "timeline.jsonl", "\n".join([
        json.dumps({"type": "header", "keys": 5}), "[1, 2]"]) + "\n"), True),
    "snapshot runs os.system": (lambda b: set_file(b, "snapshot.pickle",
                                                   pickle.dumps({"s": [_Evil()]})), True),
    "snapshot expansion bomb": (lambda b: set_file(b, "snapshot.pickle", _bomb()), True),
    "snapshot truncated": (lambda b: set_file(b, "snapshot.pickle",
                                              pickle.dumps({"s": [1] * 100})[:-7]), True),
    "environment 0xFF byte": (lambda b: set_file(b, "environment.json", b'{"a": "\xff"}'),
                              True),
    "finding 4 MB message": (lambda b: set_file(b, "findings.json", json.dumps([{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "grows " * 700_000}])), False),
    "terminal escapes in a finding": (lambda b: set_file(b, "findings.json", json.dumps([{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b", "culprit": "\x1b[1mbold"}])),
        False),
    "snapshot segments wrongly typed": (lambda b: set_file(b, "snapshot.pickle", pickle.dumps(
        {"segments": {"a": 1}, "device_traces": "x"})), False),
}
