"""A seeded fuzz test of the CLI's readers over mutated real bundles.

Each case copies a real bundle, mutates it at random (bytes flipped, cut, control characters
and invalid UTF-8 inserted; a JSON value replaced by another type, a huge number, a deep nest,
a long string; a file turned into a symlink, a FIFO, a directory, or removed; the manifest's
sizes kept consistent most of the time, so the content is what gets read), then runs
``memwatch inspect``, ``ls`` and now and then ``report`` on it. Every answer must be exit code 0,
or 2 with one line on stderr; nothing may escape as a traceback or print a terminal control
character, and no case may end in the CLI's last resort ("malformed input ... please report
this", :data:`memwatch.cli.CAUGHT_MALFORMED`): the readers refuse bad input themselves.
Bounded: a fixed seed, at most :data:`CASES` cases and :data:`BUDGET_S` CPU seconds of this
thread (a slower machine runs fewer cases, never fewer than :data:`MIN_CASES`; a loaded one the
same cases, later).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hostile_bundles import real_bundle
from memwatch.cli import CAUGHT_MALFORMED, main

SEED = 25
CASES = 400
MIN_CASES = 60
BUDGET_S = 25.0  # CPU seconds of this thread (the CLI runs in it): the same cases on a busy machine

_VALUES: list[Any] = [None, True, -1, 0, 2**63, 10**30, 1e308, float("nan"), "",
                      "\x1b[2J\x07", "x" * 70_000, [], {}, [1, "a", None], {"a": [{"b": 1}]},
                      "\udcff", -2**40]


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:20]):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def _mutate_json(rnd: random.Random, data: bytes) -> bytes:
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    path = rnd.choice(_paths(doc))
    value = rnd.choice([*_VALUES, _deep(rnd.choice([70, 400]))])
    text = json.dumps(_replace(doc, path, value), ensure_ascii=rnd.random() < 0.5)
    return text.encode("utf-8", "surrogatepass")


def _mutate_bytes(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rnd.randrange(5)
    if op == 0 and b:  # flip bytes
        for _ in range(rnd.randint(1, 8)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
    elif op == 1:  # cut
        b = b[: rnd.randrange(len(b) + 1)]
    elif op == 2:  # insert control characters or invalid UTF-8
        i = rnd.randrange(len(b) + 1)
        b[i:i] = rnd.choice([b"\x1b]0;t\x07", b"\xff\xfe", b"\x00", b"\x9b2J", b"\r"])
    elif op == 3 and b:  # duplicate a chunk
        i = rnd.randrange(len(b))
        b[i:i] = b[i:i + rnd.randint(1, 200)] * rnd.randint(1, 50)
    else:  # empty
        b = bytearray()
    return bytes(b)


def _mutate(rnd: random.Random, b: Path) -> str:
    # (a second mutation picks among the regular files the first one left)
    files = sorted(p.name for p in b.iterdir() if p.is_file() and not p.is_symlink())
    name = rnd.choice(files)
    f = b / name
    op = rnd.random()
    if op < 0.45 and name.endswith(".json"):
        f.write_bytes(_mutate_json(rnd, f.read_bytes()))
        what = "json"
    elif op < 0.55 and name == "timeline.jsonl":
        lines = f.read_bytes().splitlines()
        i = rnd.randrange(len(lines))
        lines[i] = _mutate_json(rnd, lines[i])
        f.write_bytes(b"\n".join(lines) + b"\n")
        what = "jsonl line"
    elif op < 0.85:
        f.write_bytes(_mutate_bytes(rnd, f.read_bytes()))
        what = "bytes"
    else:
        f.unlink()
        kind = rnd.randrange(4)
        if kind == 0:
            f.symlink_to(rnd.choice(["/etc/passwd", "/dev/zero", str(b / files[0])]))
        elif kind == 1:
            os.mkfifo(f)
        elif kind == 2:
            f.mkdir()
        what = ["symlink", "fifo", "directory", "removed"][kind]
    if name != "manifest.json" and rnd.random() < 0.9 and (b / "manifest.json").is_file():
        try:  # keep the sizes consistent: the content is what the reader must judge
            m = json.loads((b / "manifest.json").read_text())
            m["files"][name] = os.lstat(f).st_size if os.path.lexists(f) else 0
            (b / "manifest.json").write_text(json.dumps(m))
        except (ValueError, KeyError, TypeError, OSError):
            pass
    return f"{what} {name}"


def _controls(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in text)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_bundle(tmp_path_factory.mktemp("fuzz"))


def test_fuzzed_bundles_never_make_a_traceback(good: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rnd = random.Random(SEED)
    t0 = time.thread_time()
    codes: Counter[tuple[str, int]] = Counter()
    backstop: list[str] = []
    caught = sum(CAUGHT_MALFORMED.values())
    done = 0
    for i in range(CASES):
        if time.thread_time() - t0 > BUDGET_S:
            break
        done += 1
        root = tmp_path / f"c{i}"
        b = root / "oom" / good.name
        shutil.copytree(good, b)
        what = _mutate(rnd, b)
        if rnd.random() < 0.3:
            what += "; " + _mutate(rnd, b)
        cmds = [["inspect", str(b)], ["ls", str(root)]]
        if i % 8 == 0:
            cmds.append(["report", str(b), "-o", str(root / "r.html")])
        for args in cmds:
            try:
                rc = main(args)
            except BaseException as e:  # noqa: BLE001 - the failure this test looks for
                pytest.fail(f"case {i} ({what}): {args[0]} raised {type(e).__name__}: {e}")
            cap = capsys.readouterr()
            lines = [ln for ln in cap.err.splitlines() if ln.strip()]
            assert rc in (0, 2), (i, what, args[0], rc, cap.err)
            if rc == 2:
                assert len(lines) == 1 and lines[0].startswith(f"memwatch {args[0]}: error:"), \
                    (i, what, cap.err)
            assert not _controls(cap.out + cap.err), (i, what, args[0])
            codes[(args[0], rc)] += 1
            if sum(CAUGHT_MALFORMED.values()) != caught:
                backstop.append(f"case {i} ({what}): {cap.err.strip()[:300]}")
                caught = sum(CAUGHT_MALFORMED.values())
        shutil.rmtree(root, ignore_errors=True)
    assert done >= MIN_CASES, f"only {done} cases in {BUDGET_S} s"
    # Both outcomes happen: the fuzzer reaches past the first checks into the renderers.
    assert codes[("inspect", 2)] > done // 5 and codes[("inspect", 0)] > done // 20, codes
    print(f"fuzz: {done} cases in {time.thread_time() - t0:.1f} CPU s, exit codes {dict(codes)}")
    # The readers refuse bad input themselves: none may reach the CLI's last resort.
    assert not backstop, "\n".join(backstop)
