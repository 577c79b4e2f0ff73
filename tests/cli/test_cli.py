"""The ``memwatch`` CLI: ls / inspect / report on real bundles, and exit code 2 with one clear
line on stderr for every kind of bad input. Also the restricted unpickler."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import memwatch
from memwatch.cli import main
from memwatch.core import safepickle
from memwatch.core.errors import UnsafePickleError
from memwatch.testing import FakeDevice

MIB = 1 << 20


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real FakeDevice OOM bundle with a timeline, epochs and a snapshot."""
    out = tmp_path_factory.mktemp("cli")
    dev = FakeDevice(total_bytes=256 * MIB)
    handles = []
    with pytest.raises(RuntimeError), memwatch.watch(device=dev, workers=False, out_dir=out,
                                                     signals=False) as mw:
        for _epoch in range(3):
            for _ in range(20):
                handles.append(dev.malloc(2 * MIB))
                mw.step()
            mw.end_epoch()
        dev.malloc(512 * MIB)
    (p,) = [c for c in (out / "oom").iterdir()]
    return p


def copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def fix_manifest_size(b: Path, fname: str) -> None:
    """Keep the manifest consistent with an edited file, so the *content* check is what fails."""
    m = json.loads((b / "manifest.json").read_text())
    m["files"][fname] = (b / fname).stat().st_size
    (b / "manifest.json").write_text(json.dumps(m))


def run_bad(args: list[str], capsys: pytest.CaptureFixture[str], expect: str) -> None:
    assert main(args) == 2
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1, cap.err
    assert lines[0].startswith(f"memwatch {args[0]}: error:") and expect in lines[0], lines[0]


# ---------------------------------------------------------------- good input
def test_ls(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(bundle.parent.parent)]) == 0
    out = capsys.readouterr().out
    assert "exception" in out and "cuda_oom" in out and bundle.name in out
    assert main(["ls", str(bundle.parent)]) == 0  # the oom/ folder itself works too


def test_inspect(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "The GPU ran out of memory (CUDA OOM) while allocating 512.0 MiB" in out
    assert "How full memory was" in out and "device.reserved" in out
    assert "Largest live tensors" in out and "Findings" in out
    assert "Timeline, last 12 of 60 samples" in out
    assert "3 epoch summaries recorded" in out
    assert "Allocator snapshot:" in out and "120.0 MiB allocated" in out


def test_report_is_self_contained(bundle: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(bundle), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "id='mw-figures'" in html and "device.allocated" in html  # the charts have data
    # Nothing is loaded from elsewhere: plotly.js is inlined (tests/test_report_browser.py
    # renders the page in headless Chromium with the network off).
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    assert "CUDA out of memory" in html
    # The bundle's own report.html is the same renderer.
    assert "id='mw-figures'" in (bundle / "report.html").read_text()


@pytest.mark.parametrize("module", ["memwatch", "memwatch.cli"])
def test_python_dash_m(bundle: Path, module: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "inspect", "/nonexistent/x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such bundle" in r.stderr
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "inspect" in r.stdout and "report" in r.stdout
    r = subprocess.run([sys.executable, "-m", module, "ls", str(bundle.parent)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and bundle.name in r.stdout, r.stderr


# ---------------------------------------------------------------- the default out_dir
def test_default_out_dir_only_when_it_holds_memwatch_output(
        bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    run_bad(["ls"], capsys, "there is no ./memwatch here; name the out_dir your run wrote to: "
                            "memwatch ls DIR")
    # A clone of this repository called memwatch: not an out_dir, whatever its folders.
    for d in (".git", ".venv", "src", "docs", "tests"):
        (tmp_path / "memwatch" / d).mkdir(parents=True)
    run_bad(["ls"], capsys, "./memwatch holds no memwatch output (no bundle, no oom/ or "
                            "blackbox/ folder, no summary.json); name the out_dir")
    # Named on purpose it is listed, as nothing: its folders are not broken bundles.
    assert main(["ls", "memwatch"]) == 0
    out = capsys.readouterr().out
    assert out == "no bundles under memwatch\n" and "unreadable" not in out
    # An out_dir (oom/ with a bundle) is taken as the default.
    shutil.rmtree(tmp_path / "memwatch")
    copy(bundle, tmp_path / "memwatch" / "oom")
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert bundle.name in out and "unreadable" not in out
    # So is one with only a black box folder (a run killed before any bundle).
    shutil.rmtree(tmp_path / "memwatch")
    (tmp_path / "memwatch" / "blackbox").mkdir(parents=True)
    assert main(["ls"]) == 0
    assert capsys.readouterr().out.startswith("no bundles under memwatch")


def test_report_takes_an_out_dir_like_inspect(bundle: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "run"
    older = copy(bundle, out_dir / "oom")
    newest = out_dir / "oom" / (bundle.name[:-3] + "999")  # later name: the newest bundle
    shutil.copytree(bundle, newest)
    for args in (["report", str(out_dir), "-o", str(tmp_path / "r.html")],
                 ["report", str(out_dir / "oom"), "-o", str(tmp_path / "r.html")]):
        assert main(args) == 0
        cap = capsys.readouterr()
        assert cap.out.strip() == str(tmp_path / "r.html")
        assert cap.err.count("\n") == 1 and f"shown: the newest, {newest}" in cap.err
        assert str(older) not in cap.err
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    run_bad(["report", str(tmp_path / "nothing-here"), "-o", str(tmp_path / "x.html")], capsys,
            "no such bundle directory")


# ---------------------------------------------------------------- bad flags: one line, exit 2
@pytest.mark.parametrize("args,expect", [
    (["inspect", "BUNDLE", "--rows", "-3"], "argument --rows: must be 0 or more, got -3"),
    (["inspect", "BUNDLE", "--rows", "x"], "argument --rows: expected a whole number, got 'x'"),
    (["inspect", "BUNDLE", "--format", "html"], "argument --format: invalid choice: 'html'"),
    (["ls", "--bogus"], "unrecognized arguments: --bogus (see memwatch ls -h)"),
    (["report"], "the following arguments are required: SOURCE"),
    (["report", "BUNDLE", "-o", "/proc/nope.html"],
     "cannot write /proc/nope.html: No such file or directory (choose another -o path)"),
    (["report", "BUNDLE", "-o", "TMP"], "is a directory; name a file, e.g. -o "),
])
def test_bad_flags_say_one_line(args: list[str], expect: str, bundle: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(bundle) if a == "BUNDLE" else str(tmp_path) if a == "TMP" else a for a in args]
    run_bad(args, capsys, expect)
    assert not list(Path("/proc").glob(".report-*"))
    assert ".report-" not in capsys.readouterr().err


# ---------------------------------------------------------------- bad input: exit 2
def test_missing_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_bad(["inspect", str(tmp_path / "nope")], capsys, "no such bundle directory")
    run_bad(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")], capsys,
            "no such bundle directory")
    run_bad(["ls", str(tmp_path / "nope")], capsys, "no such directory")
    (tmp_path / "empty").mkdir()
    run_bad(["inspect", str(tmp_path / "empty")], capsys, "no manifest.json")


def test_truncated_manifest(bundle: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    data = (b / "manifest.json").read_bytes()
    (b / "manifest.json").write_bytes(data[: len(data) // 2])
    run_bad(["inspect", str(b)], capsys, "corrupted or truncated manifest")


def test_unknown_schema(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    m = json.loads((b / "manifest.json").read_text())
    m["schema_version"] = 99
    (b / "manifest.json").write_text(json.dumps(m))
    run_bad(["inspect", str(b)], capsys, "unknown bundle schema_version 99")


def test_incomplete_bundles(bundle: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    (b / "census.json").unlink()
    run_bad(["inspect", str(b)], capsys, "census.json listed in the manifest is missing")
    b2 = copy(bundle, tmp_path / "x")
    m = json.loads((b2 / "manifest.json").read_text())
    m["complete"] = False
    (b2 / "manifest.json").write_text(json.dumps(m))
    run_bad(["report", str(b2), "-o", str(tmp_path / "r.html")], capsys, "incomplete bundle")


def test_truncated_data_file(bundle: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    data = (b / "exception.json").read_bytes()
    (b / "exception.json").write_bytes(data[:40])
    run_bad(["inspect", str(b)], capsys, "truncated or modified")
    fix_manifest_size(b, "exception.json")  # consistent sizes: now the JSON itself is bad
    run_bad(["inspect", str(b)], capsys, "corrupted or truncated JSON")


def test_corrupted_timeline_line(bundle: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    lines = (b / "timeline.jsonl").read_text().splitlines()
    lines[5] = lines[5][: len(lines[5]) // 2]
    (b / "timeline.jsonl").write_text("\n".join(lines) + "\n")
    fix_manifest_size(b, "timeline.jsonl")
    run_bad(["inspect", str(b)], capsys, "timeline.jsonl:6: corrupted or truncated line")


class _Evil:
    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.sentinel}",))


def test_malicious_snapshot_is_refused_and_never_runs(bundle: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "pwned"
    b = copy(bundle, tmp_path)
    (b / "snapshot.pickle").write_bytes(pickle.dumps({"segments": [_Evil(str(sentinel))]}))
    fix_manifest_size(b, "snapshot.pickle")
    run_bad(["inspect", str(b)], capsys, "posix.system")
    run_bad(["report", str(b), "-o", str(tmp_path / "r.html")], capsys, "only plain containers")
    assert not sentinel.exists()
    assert not (tmp_path / "r.html").exists()
    # Sanity check that the payload is real: the stdlib unpickler would have run it.
    pickle.loads((b / "snapshot.pickle").read_bytes())
    assert sentinel.exists()


def test_truncated_snapshot(bundle: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    b = copy(bundle, tmp_path)
    data = (b / "snapshot.pickle").read_bytes()
    (b / "snapshot.pickle").write_bytes(data[: len(data) // 2])
    fix_manifest_size(b, "snapshot.pickle")
    run_bad(["inspect", str(b)], capsys, "truncated or corrupted")


def test_ls_reports_broken_bundles_without_failing(bundle: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "oom"
    root.mkdir()
    copy(bundle, root)
    (root / ".tmp-host-1-abcd").mkdir()
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cuda_oom" in out and "unreadable" in out and "incomplete" in out


# ---------------------------------------------------------------- the restricted unpickler
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_safepickle_plain_data_roundtrip(protocol: int) -> None:
    data = {"segments": [{"size": 512, "frames": [("f.py", 3)], "tags": {1, 2}, "b": b"\x00",
                          "x": 1.5, "none": None, "flag": True, "fz": frozenset({"a"})}]}
    assert safepickle.loads(pickle.dumps(data, protocol=protocol)) == data


@pytest.mark.parametrize("payload", [
    pickle.dumps(_Evil("/tmp/never")),
    pickle.dumps(Path("/tmp")),
    b"cos\nsystem\n(S'echo hi'\ntR.",
])
def test_safepickle_refuses_globals(payload: bytes) -> None:
    with pytest.raises(UnsafePickleError):
        safepickle.loads(payload)
