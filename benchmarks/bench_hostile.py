"""Hostile cases on a shared machine: what an attacker or a fault can make memwatch do.

Each case runs in its own interpreter (so a hang or a crash is one failed case, not a stopped
benchmark) with a time limit, against the memwatch of ``--src`` (default: this checkout), and says
whether memwatch held: the victim's file is unchanged, the secret is not in what was written, the
CLI answered with one line and exit code 2 in bounded time and memory, the exporter still
answered, retention left the other run's bundle alone... The groups follow issue 25:

* ``files``: symlinks planted where memwatch writes, insecure output folders, file modes;
* ``redact``: secret shapes in messages, token-shaped keys on every path, truncation, time;
* ``readers``: hostile bundles given to ``memwatch inspect``, ``report`` and ``ls``, and hostile
  black-box records given to ``memwatch ls`` and to the next run's start;
* ``exporter``: idle and slow TCP clients of the Prometheus exporter;
* ``retention``: two runs sharing an ``out_dir``, a full disk;
* ``kept``: what already held and must keep holding.

Cases that need root (``chown`` to another uid, a small tmpfs) say so and are skipped otherwise.
Prints a table and writes ``benchmarks/results/hostile.json``.

    python benchmarks/bench_hostile.py                       # every case, this checkout
    python benchmarks/bench_hostile.py --src /old/src        # another tree (before/after)
    python benchmarks/bench_hostile.py --only readers        # cases whose name has a word
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "hostile.json"
SECRET = "hf_" + "Q7x9Lm2Kp4Zr8Tn6Vb3Wc5Yd1Fg0Hj" + "SECRETPART"
VICTIM_TEXT = "the victim's precious file\n"

Result = tuple[bool | None, str]  # held (None: skipped), detail
CASES: dict[str, Callable[[Path, str], Result]] = {}


def case(name: str) -> Callable[[Callable[[Path, str], Result]], Callable[[Path, str], Result]]:
    def deco(fn: Callable[[Path, str], Result]) -> Callable[[Path, str], Result]:
        CASES[name] = fn
        return fn
    return deco


# --------------------------------------------------------------------------- helpers (child side)
def victim(work: Path) -> Path:
    v = work / "victim.txt"
    v.write_text(VICTIM_TEXT)
    return v


def victim_ok(v: Path) -> bool:
    return v.read_text() == VICTIM_TEXT


def make_bundle(out_dir: Path, message: str = "boom", report: str = "tables",
                **kw: Any) -> Path:
    """A real bundle: a FakeDevice OOM inside capture_oom()."""
    import memwatch
    from memwatch.testing import FakeDevice

    dev = FakeDevice(total_bytes=64 << 20)
    path = None
    with memwatch.watch(device=dev, workers=False, out_dir=str(out_dir), signals=False,
                        bundle_report=report, **kw) as mw:
        for _ in range(5):
            mw.step()
        dev.malloc(8 << 20)
        try:
            with mw.capture_oom():
                dev.malloc(128 << 20)
        except Exception as e:  # noqa: BLE001
            path = e.memwatch_bundle  # type: ignore[attr-defined]
    assert path is not None, "no bundle written"
    return Path(path)


def run_cli(src: str, *args: str, timeout: float = 60.0) -> dict[str, Any]:
    """``python -m memwatch.cli ARGS``: exit code, output, seconds, peak RSS (MiB)."""
    env = dict(os.environ, PYTHONPATH=src, COLUMNS="120")
    t0 = time.monotonic()
    out_f = tempfile.TemporaryFile()
    err_f = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "memwatch.cli", *args], stdout=out_f,
                            stderr=err_f, env=env, start_new_session=True)
    deadline = t0 + timeout
    rc: int | None = None
    ru = None
    while time.monotonic() < deadline:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.02)
    if rc is None:
        os.killpg(proc.pid, signal.SIGKILL)
        _, status, ru = os.wait4(proc.pid, 0)
        rc = None
    proc.returncode = 0  # reaped by wait4 above
    secs = time.monotonic() - t0
    out_f.seek(0)
    err_f.seek(0)
    out = out_f.read().decode("utf-8", "replace")
    err = err_f.read().decode("utf-8", "replace")
    return {"rc": rc, "out": out, "err": err, "s": secs,
            "rss_mib": (ru.ru_maxrss / 1024.0) if ru is not None else 0.0}


def one_line_exit2(r: dict[str, Any], max_s: float = 10.0, max_mib: float = 1024.0) -> Result:
    """Held: exit code 2, one line on stderr, no traceback, bounded time and memory."""
    lines = [ln for ln in r["err"].splitlines() if ln.strip()]
    why = (f"rc={r['rc']} stderr_lines={len(lines)} {r['s']:.1f}s {r['rss_mib']:.0f}MiB "
           + (lines[-1][:90] if lines else ""))
    ok = (r["rc"] == 2 and len(lines) == 1 and "Traceback" not in r["err"] + r["out"]
          and r["s"] < max_s and r["rss_mib"] < max_mib)
    return ok, why


def controls_in(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in text)


def clean_cli(r: dict[str, Any], max_s: float = 10.0, max_mib: float = 1024.0) -> Result:
    """Held: rc 0 or a one-line exit 2; no traceback; bounded; no terminal control characters."""
    if r["rc"] == 2:
        ok, why = one_line_exit2(r, max_s, max_mib)
    else:
        ok = r["rc"] == 0 and "Traceback" not in r["err"] and r["s"] < max_s \
            and r["rss_mib"] < max_mib
        why = f"rc={r['rc']} {r['s']:.1f}s {r['rss_mib']:.0f}MiB"
    if controls_in(r["out"] + r["err"]):
        ok, why = False, why + " control characters printed"
    return ok, why


def host_only() -> str:
    return socket.gethostname()


def is_root() -> bool:
    return os.geteuid() == 0


def expect_config_error(fn: Callable[[], Any]) -> Result:
    try:
        fn()
    except ValueError as e:  # ConfigError is a ValueError
        return True, f"ConfigError: {str(e)[:100]}"
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {str(e)[:100]}"
    return False, "accepted silently"


def watch_once(out_dir: str, **kw: Any) -> None:
    import memwatch

    with memwatch.watch(device="cpu", workers=False, out_dir=out_dir, signals=False,
                        **kw) as mw:
        mw.step()


# --------------------------------------------------------------------------- files
@case("files: symlink at the black box's temporary name")
def _bb_tmp(work: Path, src: str) -> Result:
    v = victim(work)
    out = work / "out"
    (out / "blackbox").mkdir(parents=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the victim run: waits until the attacker planted the link
        os.close(w)
        os.read(r, 1)
        try:
            watch_once(str(out))
        finally:
            os._exit(0)
    os.close(r)
    link = out / "blackbox" / f"{host_only()}-pid{pid}.json.tmp"
    link.symlink_to(v)
    os.write(w, b"x")
    os.waitpid(pid, 0)
    return victim_ok(v), "victim unchanged" if victim_ok(v) else "victim overwritten"


@case("files: symlink at the ended/ move of a dead run's record")
def _bb_ended(work: Path, src: str) -> Result:
    v = victim(work)
    out = work / "out"
    bb = out / "blackbox"
    (bb / "ended").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    updated = 1_700_000_000.0
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    doc = {"schema": 1, "kind": "memwatch-blackbox", "host": host_only(), "pid": dead.pid,
           "proc_start": 1, "boot_id": boot, "started_unix": updated - 60,
           "updated_unix": updated, "step": 3, "epoch": 0, "latest": {}, "cgroup": None,
           "findings": [], "samples": []}
    name = f"{host_only()}-pid{dead.pid}.json"
    (bb / name).write_text(json.dumps(doc))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(updated))
    (bb / "ended" / f"{stamp}-{host_only()}-pid{dead.pid}.tmp").symlink_to(v)
    with contextlib.suppress(Exception):
        watch_once(str(out))
    return victim_ok(v), "victim unchanged" if victim_ok(v) else "victim overwritten"


@case("files: .tmp-* bundle directory swapped for a symlink mid-write")
def _tmp_swap(work: Path, src: str) -> Result:
    vdir = work / "victim_dir"
    vdir.mkdir()
    out = work / "out"
    os.environ["MEMWATCH_TEST_BUNDLE_PAUSE_S"] = "0.3"
    stop = threading.Event()

    def attacker() -> None:
        oom = out / "oom"
        while not stop.is_set():
            try:
                for c in oom.iterdir():
                    if c.name.startswith(".tmp-") and not c.is_symlink():
                        os.rename(c, work / "moved")
                        c.symlink_to(vdir)
                        return
            except OSError:
                pass
            time.sleep(0.005)

    t = threading.Thread(target=attacker)
    t.start()
    try:
        with contextlib.suppress(Exception):
            make_bundle(out, report="none")
    finally:
        stop.set()
        t.join()
        os.environ.pop("MEMWATCH_TEST_BUNDLE_PAUSE_S", None)
    written = sorted(p.name for p in vdir.iterdir())
    return not written, f"files written into the victim's directory: {written}"


@case("files: JsonlSink path is a symlink to the victim's file")
def _jsonl_link(work: Path, src: str) -> Result:
    from memwatch.sinks import JsonlSink

    v = victim(work)
    link = work / "events.jsonl"
    link.symlink_to(v)
    try:
        sink = JsonlSink(str(link))
        watch_once(str(work / "out"), sinks=[sink], log_every_n_steps=1)
    except ValueError as e:
        return victim_ok(v), f"ConfigError: {str(e)[:80]}"
    return victim_ok(v), "victim unchanged" if victim_ok(v) else "appended to the victim"


@case("files: memwatch report -o at a symlink to the victim's file")
def _report_o(work: Path, src: str) -> Result:
    b = make_bundle(work / "out", report="none")
    v = victim(work)
    link = work / "r.html"
    link.symlink_to(v)
    r = run_cli(src, "report", str(b), "-o", str(link))
    return victim_ok(v), f"rc={r['rc']} victim {'unchanged' if victim_ok(v) else 'overwritten'}"


@case("files: out_dir owned by another user")
def _outdir_owner(work: Path, src: str) -> Result:
    if not is_root():
        return None, "needs root (chown)"
    out = work / "theirs"
    out.mkdir(mode=0o755)
    os.chown(out, 4242, 4242)
    return expect_config_error(lambda: watch_once(str(out)))


@case("files: out_dir writable by everyone (0777, not sticky)")
def _outdir_777(work: Path, src: str) -> Result:
    out = work / "open"
    out.mkdir()
    os.chmod(out, 0o777)
    return expect_config_error(lambda: watch_once(str(out)))


@case("files: out_dir is a regular file")
def _outdir_file(work: Path, src: str) -> Result:
    f = work / "afile"
    f.write_text("x")
    return expect_config_error(lambda: watch_once(str(f)))


@case("files: out_dir under /proc")
def _outdir_proc(work: Path, src: str) -> Result:
    return expect_config_error(lambda: watch_once("/proc/self/memwatch-out"))


@case("files: private modes (dirs 0700, files 0600) under umask 022")
def _modes(work: Path, src: str) -> Result:
    from memwatch.sinks import JsonlSink

    os.umask(0o022)
    out = work / "out"
    sink = JsonlSink(str(out / "events.jsonl"))
    import memwatch
    from memwatch.testing import FakeDevice

    dev = FakeDevice(total_bytes=64 << 20)
    with memwatch.watch(device=dev, workers=False, out_dir=str(out), signals=False,
                        bundle_report="tables", sinks=[sink], log_every_n_steps=1) as mw:
        mw.step()
        mw.dump("look")
        bad = []
        for root, dirs, files in os.walk(out):
            for d in dirs:
                m = os.stat(os.path.join(root, d)).st_mode & 0o777
                if m & 0o077:
                    bad.append(f"{d} {m:o}")
            for f in files:
                m = os.stat(os.path.join(root, f)).st_mode & 0o777
                if m & 0o077:
                    bad.append(f"{f} {m:o}")
    m = os.stat(out).st_mode & 0o777
    if m & 0o077:
        bad.append(f"out_dir {m:o}")
    return not bad, f"{len(bad)} readable by others: {', '.join(bad[:4])}"


# --------------------------------------------------------------------------- redaction
_SHAPES = {
    "token=X": f"push failed: token={'Zq' * 10}X1",
    "Bearer header": f"Authorization: Bearer {'Zq' * 10}X2",
    "dict repr": "headers={'Authorization': 'Bearer " + "Zq" * 10 + "X3'}",
    "URL query token": f"GET https://hub.example/api?access_token={'Zq' * 10}X4&x=1",
    "Basic header": f"Authorization: Basic {'Zq' * 10}X5==",
    "PEM block": "key: -----BEGIN RSA PRIVATE KEY-----\nMIIEow" + "Zq" * 10
                 + "X6\n-----END RSA PRIVATE KEY-----",
    "hf_": f"hf_{'Zq' * 10}X7",
    "ghp_": f"ghp_{'Zq' * 10}X8",
    "AKIA": "AKIAZQZQZQZQZQZQX9ZQ",
    "sk-": f"sk-{'Zq' * 10}X10",
    "password: X": f"password: {'Zq' * 10}X11",
}


def _shape_case(label: str) -> Callable[[Path, str], Result]:
    def run(work: Path, src: str) -> Result:
        from memwatch.core.redact import redact_text

        text = _SHAPES[label]
        secret = "Zq" * 10 if label != "AKIA" else "ZQZQZQZQZQZQX9ZQ"
        out = redact_text(text)
        return secret not in out, out[:90].replace("\n", "\\n")
    return run


for _label in _SHAPES:
    case(f"redact: shape {_label}")(_shape_case(_label))


def _key_finding() -> Any:
    from memwatch.core.findings import Finding

    return Finding(kind="leak", metric="host.rss", severity="warning",
                   message=f"host.rss grows; held by store['{SECRET}']",
                   culprit=f"store['{SECRET}'] (global dict)",
                   evidence={"holders": [{"name": f"store['{SECRET}']"}]})


@case("redact: token-shaped key in the black box")
def _key_bb(work: Path, src: str) -> Result:
    import memwatch

    out = work / "out"
    with memwatch.watch(device="cpu", workers=False, out_dir=str(out), signals=False) as mw:
        mw.step()
        mw.findings.append(_key_finding())
        mw.blackbox.write()
        text = mw.blackbox.path.read_text()
    return "SECRETPART" not in text, "secret in the record" if "SECRETPART" in text else "ok"


@case("redact: token-shaped key in JSONL events")
def _key_jsonl(work: Path, src: str) -> Result:
    from memwatch.sinks import JsonlSink

    p = work / "ev.jsonl"
    s = JsonlSink(str(p))
    s.on_findings(0, [_key_finding()], None)
    s.close()
    text = p.read_text()
    return "SECRETPART" not in text, "secret in the log" if "SECRETPART" in text else "ok"


@case("redact: token-shaped key in render_run's report")
def _key_report(work: Path, src: str) -> Result:
    import memwatch
    from memwatch.report.html import render_run

    with memwatch.watch(device="cpu", workers=False, out_dir=str(work / "out"),
                        signals=False) as mw:
        for _ in range(3):
            mw.step()
        mw.findings.append(_key_finding())
        p = render_run(mw, str(work / "r.html"))
    text = Path(p).read_text()
    return "SECRETPART" not in text, "secret in the report" if "SECRETPART" in text else "ok"


@case("redact: PEM key cut by the 256 KiB traceback truncation")
def _pem_cut(work: Path, src: str) -> Result:
    import memwatch

    body = "MIIEowIBAAKCAQEA" + "".join(f"PEMBODY{i:04d}" for i in range(200))
    pem = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    msg = pem + "y" * (262144 - len(pem) // 2)
    path = None
    with memwatch.watch(device="cpu", workers=False, out_dir=str(work / "out"),
                        signals=False, bundle_on="all", bundle_report="none") as mw:
        mw.step()
        try:
            raise RuntimeError(msg)
        except RuntimeError as e:
            path = mw.recorder.handle_exception(e)
    text = (Path(path) / "exception.json").read_text()
    return "PEMBODY" not in text, "PEM body in exception.json" if "PEMBODY" in text else "ok"


@case("redact: 48 KiB token in a message (time to redact)")
def _redact_time(work: Path, src: str) -> Result:
    import random

    from memwatch.core.redact import redact_text

    rnd = random.Random(0)
    tok = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                  for _ in range(48 * 1024))
    t0 = time.perf_counter()
    redact_text(f"request failed: {tok}")
    s = time.perf_counter() - t0
    return s < 0.5, f"{s:.2f} s"


# --------------------------------------------------------------------------- readers
def _good(work: Path) -> Path:
    return make_bundle(work / "out", report="none")


def _set_file(b: Path, name: str, data: bytes | str) -> None:
    """Replace a bundle file and keep the manifest's size right (so only the content is bad)."""
    raw = data.encode() if isinstance(data, str) else data
    (b / name).write_bytes(raw)
    m = json.loads((b / "manifest.json").read_text())
    m["files"][name] = len(raw)
    (b / "manifest.json").write_text(json.dumps(m))


def _patch_json(b: Path, name: str, fn: Callable[[Any], Any]) -> None:
    doc = json.loads((b / name).read_text())
    new = fn(doc)
    _set_file(b, name, json.dumps(new if new is not None else doc))


def _manifest(b: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    m = json.loads((b / "manifest.json").read_text())
    fn(m)
    (b / "manifest.json").write_text(json.dumps(m))


DEEP = "[" * 100_000 + "]" * 100_000
MARK = "OUTSIDE-THE-BUNDLE-MARK"


def _outside(b: Path) -> Path:
    """A file of someone else's, beside the bundle's out_dir (work/outside.json)."""
    f = b.parents[2] / "outside.json"
    if not f.exists():
        f.write_text(json.dumps({"type": "Secret", "message": MARK, "numbers": {}}))
    return f


def _evil_pickle() -> bytes:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("touch /tmp/memwatch-hostile-pwned",))
    return pickle.dumps({"segments": [Evil()]})


def _bomb_pickle() -> bytes:
    blocks = [{"size": 512, "state": "active_allocated", "frames": []}] * 1
    seg = {"total_size": 1 << 20, "allocated_size": 512, "blocks": blocks * 3000}
    return pickle.dumps({"segments": [seg] * 3000}, protocol=4)


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "manifest 100k-deep JSON": lambda b: (b / "manifest.json").write_text(DEEP),
    "manifest not an object": lambda b: (b / "manifest.json").write_text("[1, 2]"),
    "manifest files not a table": lambda b: _manifest(b, lambda m: m.update(files=[1])),
    "manifest 0xFF byte": lambda b: (b / "manifest.json").write_bytes(
        (b / "manifest.json").read_bytes().replace(b'"trigger"', b'"trig\xffer"')),
    "manifest names ../ path": lambda b: _manifest(b, lambda m: m["files"].update(
        {"../../../outside.json": os.path.getsize(_outside(b))})),
    "manifest bytes is a string": lambda b: _manifest(b, lambda m: m.update(bytes="lots")),
    "manifest rank is a list": lambda b: _manifest(b, lambda m: m.update(rank=[0],
                                                                         world_size=[2])),
    "exception.json symlink outside": lambda b: (
        (b / "exception.json").unlink(), (b / "exception.json").symlink_to(_outside(b)),
        _manifest(b, lambda m: m["files"].update(
            {"exception.json": os.path.getsize(_outside(b))}))),
    "exception.json 100k-deep": lambda b: _set_file(b, "exception.json", DEEP),
    "exception numbers a list": lambda b: _patch_json(b, "exception.json",
                                                      lambda d: d.update(numbers=[1, 2])),
    "exception message an object": lambda b: _patch_json(b, "exception.json",
                                                         lambda d: d.update(message={"a": 1})),
    "exception traceback an int": lambda b: _patch_json(b, "exception.json",
                                                        lambda d: d.update(traceback=7)),
    "memory latest a list": lambda b: _patch_json(b, "memory.json",
                                                  lambda d: d.update(latest=[1, 2])),
    "memory limits strings": lambda b: _patch_json(b, "memory.json", lambda d: d.update(
        limits={"host.rss": "big", "device.allocated": "x"})),
    "findings an object": lambda b: _set_file(b, "findings.json", '{"kind": "leak"}'),
    "finding 4 MB message": lambda b: _set_file(b, "findings.json", json.dumps([{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "grows " * 700_000, "suggestions": ["x"]}])),
    "finding fields wrongly typed": lambda b: _set_file(b, "findings.json", json.dumps([{
        "kind": 3, "metric": ["x"], "severity": 5, "message": None, "suggestions": "abc",
        "evidence": [1], "bytes_per_step": "lots", "steps_to_oom": {}}])),
    "census top an object": lambda b: _set_file(b, "census.json",
                                                json.dumps({"top": {"a": 1}})),
    "census tensors wrongly typed": lambda b: _set_file(b, "census.json", json.dumps({
        "top": [{"shape": 5, "bytes": "x", "dtype": [1], "holders": "h"}]})),
    "timeline 200 MB": lambda b: _big_timeline(b),
    "timeline records wrongly typed": lambda b: _set_file(b, "timeline.jsonl", "\n".join([
        json.dumps({"type": "header", "keys": 5}), "[1, 2]",
        json.dumps({"type": "sample", "step": "x", "t": "y", "host.rss": "z"}),
        json.dumps({"type": "epoch", "epoch": [1], "end_step": {}})]) + "\n"),
    "snapshot runs os.system": lambda b: _set_file(b, "snapshot.pickle", _evil_pickle()),
    "snapshot 24 KB expansion bomb": lambda b: _set_file(b, "snapshot.pickle", _bomb_pickle()),
    "snapshot truncated": lambda b: _set_file(b, "snapshot.pickle",
                                              pickle.dumps({"segments": [1] * 100})[:-7]),
    "snapshot wrongly typed": lambda b: _set_file(b, "snapshot.pickle", pickle.dumps(
        {"segments": {"a": 1}, "device_traces": "x"})),
    "terminal escapes in a finding": lambda b: _set_file(b, "findings.json", json.dumps([{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "\x1b]0;pwned\x07\x1b[2J\x1b[31mred", "culprit": "\x1b[1mbold"}])),
    "environment 0xFF byte": lambda b: _set_file(b, "environment.json", b'{"a": "\xff"}'),
    "allocator stats a list": lambda b: _patch_json(b, "allocator.json", lambda d: d.update(
        memory_stats=[1], segments_summary="x")),
    "exception.json is a FIFO": lambda b: (
        (b / "exception.json").unlink(), os.mkfifo(b / "exception.json"),
        _manifest(b, lambda m: m["files"].update({"exception.json": 0}))),
}


def _big_timeline(b: Path) -> None:
    line = json.dumps({"type": "sample", "step": 1, "t": 1.0,
                       **{f"m{i}.x": 1.5e9 for i in range(20)}}) + "\n"
    n = (200 << 20) // len(line)
    with open(b / "timeline.jsonl", "w") as f:
        f.write(json.dumps({"type": "header", "keys": [f"m{i}.x" for i in range(20)]}) + "\n")
        for i in range(n):
            f.write(line.replace('"step": 1,', f'"step": {i},'))
    _manifest(b, lambda m: m["files"].update(
        {"timeline.jsonl": os.path.getsize(b / "timeline.jsonl")}))


#: Bundles that must be refused (exit 2), not rendered around.
REFUSE = ("manifest names ../ path", "exception.json symlink outside")


def _reader_case(label: str, command: str) -> Callable[[Path, str], Result]:
    def run(work: Path, src: str) -> Result:
        b = _good(work)
        MUTATIONS[label](b)
        Path("/tmp/memwatch-hostile-pwned").unlink(missing_ok=True)
        if command == "ls":
            good = make_bundle(work / "out", report="none")
            r = run_cli(src, "ls", str(work / "out"))
            ok, why = clean_cli(r)
            if r["rc"] != 0 or good.name not in r["out"]:
                ok, why = False, why + " good bundle not listed"
        elif command == "report":
            r = run_cli(src, "report", str(b), "-o", str(work / "r.html"))
            ok, why = one_line_exit2(r) if r["rc"] != 0 else (True, f"rc=0 {r['s']:.1f}s")
            if r["rc"] == 0 and (work / "r.html").exists():
                html = (work / "r.html").read_text(errors="replace")
                if MARK in html:
                    ok, why = False, "a file outside the bundle embedded in the report"
                if r["s"] > 10 or r["rss_mib"] > 1024:
                    ok, why = False, f"rc=0 {r['s']:.1f}s {r['rss_mib']:.0f}MiB"
        else:
            r = run_cli(src, "inspect", str(b))
            ok, why = clean_cli(r)
            if MARK in r["out"]:
                ok, why = False, "a file outside the bundle printed"
        if label in REFUSE and command != "ls" and r["rc"] != 2:
            ok, why = False, f"rc={r['rc']}: accepted (should be refused)"
        if Path("/tmp/memwatch-hostile-pwned").exists():
            ok, why = False, "the pickle ran code"
        return ok, why
    return run


for _label in MUTATIONS:
    for _cmd in ("inspect", "report", "ls"):
        case(f"readers: {_cmd} / {_label}")(_reader_case(_label, _cmd))


def _dead_record(out: Path, **extra: Any) -> Path:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    bb = out / "blackbox"
    bb.mkdir(parents=True, exist_ok=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    doc = {"schema": 1, "kind": "memwatch-blackbox", "host": host_only(), "pid": dead.pid,
           "proc_start": 1, "boot_id": boot, "started_unix": 1.0, "updated_unix": 2.0,
           "step": 3, "epoch": 0, "latest": {}, "cgroup": None, "findings": [], "samples": [],
           **extra}
    p = bb / f"{host_only()}-pid{dead.pid}.json"
    p.write_text(json.dumps(doc))
    return p


def _fifo_cgroup(work: Path) -> dict[str, Any]:
    cg = work / "fakecg"
    cg.mkdir()
    os.mkfifo(cg / "memory.events")
    return {"path": str(cg), "version": 2, "oom_kills": 0}


def _zero_cgroup(work: Path) -> dict[str, Any]:
    cg = work / "zerocg"
    cg.mkdir()
    (cg / "memory.events").symlink_to("/dev/zero")
    return {"path": str(cg), "version": 2, "oom_kills": 0}


@case("readers: ls / black-box record whose cgroup file is a FIFO")
def _bb_fifo_ls(work: Path, src: str) -> Result:
    _dead_record(work / "out", cgroup=_fifo_cgroup(work))
    return clean_cli(run_cli(src, "ls", str(work / "out"), timeout=20))


@case("readers: ls / black-box record whose cgroup file is /dev/zero")
def _bb_zero_ls(work: Path, src: str) -> Result:
    _dead_record(work / "out", cgroup=_zero_cgroup(work))
    return clean_cli(run_cli(src, "ls", str(work / "out"), timeout=20))


@case("readers: next run's start / black-box record with a FIFO cgroup file")
def _bb_fifo_start(work: Path, src: str) -> Result:
    _dead_record(work / "out", cgroup=_fifo_cgroup(work))
    code = (f"import sys; sys.path.insert(0, {src!r}); import memwatch\n"
            f"with memwatch.watch(device='cpu', workers=False, out_dir={str(work / 'out')!r},"
            " signals=False) as mw: mw.step()\nprint('started')")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=20)
    except subprocess.TimeoutExpired:
        return False, "start hung"
    return "started" in p.stdout, f"rc={p.returncode}"


@case("readers: ls / black-box record file is a FIFO")
def _bb_record_fifo(work: Path, src: str) -> Result:
    bb = work / "out" / "blackbox"
    bb.mkdir(parents=True)
    os.mkfifo(bb / f"{host_only()}-pid99999999.json")
    return clean_cli(run_cli(src, "ls", str(work / "out"), timeout=20))


@case("readers: ls / black-box record 100k-deep JSON")
def _bb_deep(work: Path, src: str) -> Result:
    bb = work / "out" / "blackbox"
    bb.mkdir(parents=True)
    (bb / f"{host_only()}-pid99999999.json").write_text(DEEP)
    make_bundle(work / "out2", report="none")
    return clean_cli(run_cli(src, "ls", str(work / "out")))


@case("readers: inspect / black-box record wrongly typed")
def _bb_typed(work: Path, src: str) -> Result:
    p = _dead_record(work / "out", samples={"a": 1}, latest=[1], findings="x",
                     cgroup=[1], step={"x": 1})
    return clean_cli(run_cli(src, "inspect", str(p)))


@case("readers: ls / bundle directory name with terminal escapes")
def _ls_escape(work: Path, src: str) -> Result:
    b = make_bundle(work / "out", report="none")
    b.rename(b.with_name(b.name + "\x1b]0;pwned\x07\x1b[2J"))
    return clean_cli(run_cli(src, "ls", str(work / "out")))


# --------------------------------------------------------------------------- exporter
def _sink() -> Any:
    from memwatch.sinks.prometheus import PrometheusSink

    return PrometheusSink(port=0)


def _scrape(port: int, timeout: float = 3.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


@case("exporter: scrape while one TCP client sits idle")
def _prom_idle(work: Path, src: str) -> Result:
    s = _sink()
    idle = socket.create_connection(("127.0.0.1", s.port))
    time.sleep(0.2)
    ok = _scrape(s.port)
    idle.close()
    threading.Thread(target=s.close, daemon=True).start()
    return ok, "scrape answered" if ok else "scrape timed out"


@case("exporter: close() while one TCP client sits idle")
def _prom_close(work: Path, src: str) -> Result:
    s = _sink()
    idle = socket.create_connection(("127.0.0.1", s.port))
    time.sleep(0.2)
    t = threading.Thread(target=s.close, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    secs = time.monotonic() - t0
    idle.close()
    return secs < 1.0, f"close() took {secs:.2f} s"


@case("exporter: scrape while 64 clients sit idle")
def _prom_many(work: Path, src: str) -> Result:
    s = _sink()
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(64)]
    time.sleep(0.2)
    ok = _scrape(s.port)
    for c in idle:
        c.close()
    threading.Thread(target=s.close, daemon=True).start()
    return ok, "scrape answered" if ok else "scrape timed out"


@case("exporter: scrape while a client trickles a request a byte at a time")
def _prom_slow(work: Path, src: str) -> Result:
    s = _sink()
    c = socket.create_connection(("127.0.0.1", s.port))
    stop = threading.Event()

    def trickle() -> None:
        for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
            if stop.is_set():
                return
            try:
                c.send(bytes([ch]))
            except OSError:
                return
            time.sleep(0.05)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(0.3)
    ok = _scrape(s.port)
    stop.set()
    c.close()
    threading.Thread(target=s.close, daemon=True).start()
    return ok, "scrape answered" if ok else "scrape timed out"


# --------------------------------------------------------------------------- retention
@case("retention: a run never deletes another run's bundles (shared out_dir)")
def _retention_other(work: Path, src: str) -> Result:
    out = work / "out"
    theirs = make_bundle(out, report="none")
    code = (f"import sys; sys.path.insert(0, {src!r}); import memwatch\n"
            f"with memwatch.watch(device='cpu', workers=False, out_dir={str(out)!r},"
            " signals=False, max_bundles=1, bundle_report='none') as mw:\n"
            "    mw.step(); mw.dump('one'); mw.dump('two')\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    return theirs.exists(), "other run's bundle kept" if theirs.exists() else "deleted"


@case("retention: full disk leaves no .part files")
def _full_disk(work: Path, src: str) -> Result:
    if not is_root():
        return None, "needs root (mount a small tmpfs)"
    mnt = work / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        return None, "cannot mount a tmpfs here"
    try:
        with contextlib.suppress(Exception):
            make_bundle(mnt / "out", report="full")  # report.html is ~5 MB: it cannot fit
        parts = [str(p.relative_to(mnt)) for p in mnt.rglob("*")
                 if p.name.endswith((".part", ".tmp")) or p.name.startswith(".tmp-")]
        return not parts, f"left: {parts[:3]}"
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# --------------------------------------------------------------------------- kept
@case("kept: secrets in env and argv never written")
def _kept_env(work: Path, src: str) -> Result:
    os.environ["HF_TOKEN"] = SECRET
    sys.argv = ["train.py", f"--api-key={SECRET}"]
    b = make_bundle(work / "out", report="none")
    text = "".join(p.read_text(errors="replace") for p in b.iterdir() if p.is_file())
    return "SECRETPART" not in text, "ok" if "SECRETPART" not in text else "secret written"


@case("kept: a read-only out_dir only warns")
def _kept_ro(work: Path, src: str) -> Result:
    ro = work / "ro"
    ro.mkdir(mode=0o500)
    mounted = False
    if is_root():  # root ignores modes: a read-only filesystem
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k,mode=0755",
                                  "tmpfs", str(ro)]).returncode == 0
        if not mounted:
            return None, "cannot mount a read-only tmpfs"
    try:
        watch_once(str(ro / "memwatch"))
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ro)])
    return True, "ran (warnings only)"


@case("kept: the exporter binds 127.0.0.1")
def _kept_loop(work: Path, src: str) -> Result:
    import psutil

    s = _sink()
    addrs = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.port == s.port}
    threading.Thread(target=s.close, daemon=True).start()
    return addrs == {"127.0.0.1"}, f"listening on {sorted(addrs)}"


@case("kept: HTML payloads in messages escaped")
def _kept_html(work: Path, src: str) -> Result:
    b = make_bundle(work / "out", message="x", report="none")
    _set_file(b, "findings.json", json.dumps([{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "<script>alert(1)</script>", "culprit": "<img src=x onerror=alert(2)>"}]))
    r = run_cli(src, "report", str(b), "-o", str(work / "r.html"))
    html = (work / "r.html").read_text() if (work / "r.html").exists() else ""
    ok = r["rc"] == 0 and "<script>alert(1)" not in html and "<img src=x" not in html
    return ok, f"rc={r['rc']}"


# --------------------------------------------------------------------------- driver
def _child(name: str, src: str, work: str) -> None:
    sys.path.insert(0, src)
    import logging

    logging.disable(logging.WARNING)
    try:
        held, why = CASES[name](Path(work), src)
    except Exception as e:  # noqa: BLE001
        held, why = False, f"raised {type(e).__name__}: {str(e)[:120]}"
    print("RESULT " + json.dumps({"held": held, "why": why}), flush=True)


def run_case(name: str, src: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="mw-hostile-")  # 0700; removed even when the case hangs
    try:
        p = subprocess.run([sys.executable, __file__, "--child", name, "--src", src,
                            "--work", work],
                           capture_output=True, text=True, timeout=timeout,
                           start_new_session=True)
        res = next((json.loads(ln[7:]) for ln in p.stdout.splitlines()
                    if ln.startswith("RESULT ")), None)
        if res is None:
            res = {"held": False, "why": f"child died (rc={p.returncode}): "
                                         + (p.stderr.strip().splitlines() or [""])[-1][:120]}
    except subprocess.TimeoutExpired:
        res = {"held": False, "why": f"hung (killed after {timeout:.0f} s)"}
    finally:
        subprocess.run(["umount", "-l", os.path.join(work, "small")], capture_output=True)
        subprocess.run(["umount", "-l", os.path.join(work, "ro")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"case": name, **res, "s": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(REPO / "src"), help="the memwatch source tree to test")
    ap.add_argument("--only", nargs="*", default=[], help="cases whose name has one of these")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per case")
    ap.add_argument("--out", default=str(RESULTS), help="JSON results file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.src, args.work)
        return {}
    names = [n for n in CASES if not args.only or any(w in n for w in args.only)]
    rows = []
    for n in names:
        r = run_case(n, os.path.abspath(args.src), args.timeout)
        rows.append(r)
        mark = {True: "held", False: "BROKEN", None: "skipped"}[r["held"]]
        print(f"{mark:8} {r['s']:6.1f}s  {n}  -- {r['why']}", flush=True)
    groups: dict[str, list[int]] = {}
    for r in rows:
        g = r["case"].split(":")[0]
        tried_held = groups.setdefault(g, [0, 0, 0])
        if r["held"] is None:
            tried_held[2] += 1
            continue
        tried_held[0] += 1
        tried_held[1] += bool(r["held"])
    print(f"\n{'group':12} {'tried':>6} {'held':>6} {'skipped':>8}")
    for g, (t, h, s) in groups.items():
        print(f"{g:12} {t:6} {h:6} {s:8}")
    tot = [sum(v[i] for v in groups.values()) for i in range(3)]
    print(f"{'all':12} {tot[0]:6} {tot[1]:6} {tot[2]:8}")
    doc = {"src": os.path.abspath(args.src), "rows": rows,
           "groups": {g: {"tried": t, "held": h, "skipped": s}
                      for g, (t, h, s) in groups.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
    sys.exit(0)
