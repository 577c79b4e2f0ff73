"""A zygote: the suite's fresh processes forked from an interpreter that has only imported.

The tests that must run in a process of their own (``fresh_process``: a planted host leak judged
as in a fresh training process; the examples, each as a user runs it) paid for a new interpreter
each, and much of that was importing torch and the frameworks again (Lightning imports
``torch._dynamo`` and torchmetrics: ~6 s of CPU on this machine). A zygote imports what its
children would (:func:`preload_for`) once, and forks a child per request: each starts where a
new interpreter would be after those imports, no test having run in it, its heap holding what
the imports left. It runs no code of its own between forks and starts no thread (it says how
many it has; with another thread alive a fork is unsafe, and the client then answers None).

Protocol, one JSON object a line: a request on stdin
``{"kind": "pytest"|"script", "args": [...], "cwd": ..., "env": {...}, "out": path}``; the
answers on stdout, ``{"pid": n}`` once the child is forked, ``{"rc": n}`` when it ended. The
child's stdout and stderr go to ``out`` (one file, as a terminal shows them). The first line
the zygote writes says it is ready: ``{"ready": true, "threads": n}`` (its threads, but the
one importing torch starts).

The client is :func:`run`: one zygote per pytest-xdist worker, started at the first request
(the root ``conftest.py``'s ``fresh_process`` tests and ``test_foundation_examples`` call it);
where it cannot start, or another thread is alive in it after its imports, ``run`` answers None
and the caller starts a plain interpreter as before. Not a test module.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import re
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: The frameworks a child may import (named as its source names them): the zygote imports the
#: ones the test module or script mentions, and nothing else it would not import itself.
FRAMEWORKS = {"lightning": "lightning.pytorch", "transformers": "transformers",
              "accelerate": "accelerate"}


def preload_for(kind: str, source: Path) -> tuple[str, ...]:
    """What a zygote for ``source`` (a test module or a script) imports: torch, the frameworks
    its text names, memwatch; and pytest with its plugins' heaviest (hypothesis) for a test."""
    text = source.read_text(errors="replace")
    frameworks = tuple(mod for word, mod in FRAMEWORKS.items()
                       if re.search(rf"\b{word}\b", text))
    runner = ("pytest", "hypothesis") if kind == "pytest" else ()
    return ("torch", *frameworks, "memwatch", *runner)


def _child(req: dict[str, Any], reply: int) -> int:
    os.close(reply)
    fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # What a new interpreter reads from its environment at start: the warning filters.
    if os.environ.get("PYTHONWARNINGS"):
        import warnings
        opts = [o for o in os.environ["PYTHONWARNINGS"].split(",") if o]
        sys.warnoptions[:] = opts
        warnings._processoptions(opts)  # type: ignore[attr-defined]  # what startup calls
    args = [str(a) for a in req["args"]]
    if req["kind"] == "pytest":
        # Plugins imported by the preloads (hypothesis, anyio through transformers' httpx) are
        # not rewritten for assertions: pytest says so, and its plugins' asserts are not ours.
        args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
        sys.argv = ["pytest", *args]
        sys.path[0] = req["cwd"]  # as `python -m pytest` from cwd puts it first
        import pytest
        return int(pytest.main(args))
    script = os.path.abspath(args[0])
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` puts its folder first
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


def _exit_as_an_interpreter() -> None:
    """What an interpreter does at its end before it exits: wait for its non-daemon threads,
    run its ``atexit`` functions (a session's last check at exit is one), flush its output."""
    import atexit
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _threads() -> int:
    """This process's threads, native ones included (an OpenMP pool is no Python thread)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def main(preload: list[str]) -> int:
    torch_threads = None
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an extra not installed: its children import it
            pass
        if name == "torch":
            torch_threads = _threads()
    # The answers go to a private copy of stdout; what the imports (and anything after) print
    # goes to stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # Importing torch starts one native thread, which every DataLoader fork carries too (the
    # fork PyTorch itself relies on); any other thread makes the fork unsafe.
    extra = _threads() - (torch_threads or 1)
    print(json.dumps({"ready": True, "threads": 1 + extra}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(req, reply.fileno())
            except BaseException:  # noqa: BLE001 - the child's crash is its exit code
                import traceback
                traceback.print_exc()
            finally:
                try:
                    _exit_as_an_interpreter()
                finally:
                    os._exit(rc if 0 <= rc < 256 else 1)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)
    return 0


class _Client:
    """This process's zygote (started at the first request, ended with the process)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self.preload = preload
        self.proc: subprocess.Popen[bytes] | None = None
        self.broken = False
        self._buf = b""
        self._eof = False  # the zygote closed its answers: it ended

    def _line(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._eof = True
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            got = json.loads(line)
        except ValueError:
            return None
        return got if isinstance(got, dict) else None

    def _start(self) -> bool:
        if self.broken or not hasattr(os, "fork"):
            return False
        if self.proc is not None:
            return self.proc.poll() is None
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # (read at import; the suite never downloads)
        self.proc = subprocess.Popen([sys.executable, __file__, *self.preload],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     cwd=str(Path(__file__).resolve().parents[1]))
        atexit.register(self.close)
        ready = self._line(time.monotonic() + 300)
        if not ready or not ready.get("ready") or ready.get("threads") != 1:
            self._fail()
            return False
        return True

    def _fail(self) -> None:
        self.broken = True
        self.close()

    def close(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def run(self, kind: str, args: list[str], cwd: Path, env: dict[str, str], out: Path,
            timeout: float) -> int | None:
        if not self._start():
            return None
        assert self.proc is not None and self.proc.stdin is not None
        req = {"kind": kind, "args": args, "cwd": str(cwd), "env": env, "out": str(out)}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self._fail()
            return None
        deadline = time.monotonic() + timeout
        forked = self._line(deadline)
        if forked is None or "pid" not in forked:
            self._fail()
            return None
        done = self._line(deadline)
        if done is not None and "rc" in done:
            return int(done["rc"])
        if self._eof or done is not None:
            # The zygote itself ended (or answered nonsense) while the child ran: no child's
            # verdict to report; the caller runs it again in an interpreter of its own.
            self._fail()
            return None
        # Past its time: the child is killed, as subprocess.run would; its exit is read so the
        # next request's answers are the next request's (else the zygote is not used again).
        os.kill(int(forked["pid"]), signal.SIGKILL)
        if self._line(time.monotonic() + 30) is None:
            self._fail()
        raise subprocess.TimeoutExpired(args, timeout)


_CLIENTS: dict[tuple[str, ...], _Client] = {}


def run(kind: str, args: list[str], *, source: Path, cwd: Path, env: dict[str, str], out: Path,
        timeout: float) -> int | None:
    """Run ``pytest <args>`` (``kind="pytest"``) or ``python <args>`` (``"script"``) in a child
    forked from this worker's zygote for ``source`` (the test module or the script: what it
    imports, :func:`preload_for`), its output written to ``out``: the exit code, or None where
    no zygote can serve (the caller starts an interpreter of its own)."""
    if os.environ.get("MEMWATCH_TEST_NO_ZYGOTE"):
        return None
    preload = preload_for(kind, source)
    client = _CLIENTS.get(preload)
    if client is None:
        client = _CLIENTS[preload] = _Client(preload)
    return client.run(kind, args, cwd, env, out, timeout)


def fresh(kind: str, args: list[str], *, source: Path, cwd: Path, env: dict[str, str],
          out: Path, timeout: float, fork: bool = True) -> tuple[int, str]:
    """``pytest <args>`` (``kind="pytest"``) or ``python <args>`` (``"script"``) in a process
    no test ran in: forked from this worker's zygote (:func:`run`), or a new interpreter where
    none can serve or ``fork`` is False (a child that must not find torch imported). The exit
    code and the output (stdout and stderr, as a terminal shows them), also left in ``out``."""
    rc = run(kind, args, source=source, cwd=cwd, env=env, out=out, timeout=timeout) \
        if fork else None
    if rc is None:
        cmd = [sys.executable, "-m", "pytest", *args] if kind == "pytest" else \
            [sys.executable, *args]
        with out.open("w") as f:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
    return rc, out.read_text(errors="replace")


def script(path: Path, args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 240, fork: bool = True) -> str:
    """``python path args...`` in a fresh process (:func:`fresh`), its output kept in its
    working folder; a non-zero exit raises with the output's tail. The output."""
    out = Path(cwd) / f"{path.stem}-{os.getpid()}-{time.monotonic_ns()}.out"
    rc, text = fresh("script", [str(path), *args], source=path, cwd=cwd,
                     env=dict(os.environ) if env is None else env, out=out, timeout=timeout,
                     fork=fork)
    if rc != 0:
        raise RuntimeError(f"python {path.name} {' '.join(args)} exited {rc}:\n{text[-8000:]}")
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
