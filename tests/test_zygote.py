"""The suite's zygote (``tests/zygote.py``): a child forked from it runs a script as ``python``
would, its exit code and output come back, a child past its time is killed, and with the
zygote switched off the caller is told to start an interpreter of its own."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import zygote


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "child.py"
    p.write_text(body)
    return p


def test_a_script_runs_as_main_with_its_code_output_and_environment(tmp_path: Path) -> None:
    script = _script(tmp_path, "import os, sys\n"
                               "print('out', os.environ['ZYGOTE_T'], __name__, sys.argv[1:])\n"
                               "print('err', file=sys.stderr)\n"
                               "print(('light' + 'ning') in sys.modules)\n"
                               "sys.exit(3)\n")
    out = tmp_path / "o.txt"
    rc = zygote.run("script", [str(script), "a"], source=script, cwd=tmp_path,
                                env={**os.environ, "ZYGOTE_T": "yes"}, out=out, timeout=120)
    assert rc == 3
    text = out.read_text()
    assert "out yes __main__ ['a']" in text and "err" in text
    # the script names no framework: its zygote imported none
    assert text.splitlines()[-1] == "False"


def test_a_child_past_its_time_is_killed(tmp_path: Path) -> None:
    script = _script(tmp_path, "import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run("script", [str(script)], source=script, cwd=tmp_path,
                               env=dict(os.environ), out=tmp_path / "o.txt", timeout=2)
    # and the zygote still serves the next request
    ok = _script(tmp_path, "print('again')\n")
    assert zygote.run("script", [str(ok)], source=ok, cwd=tmp_path,
                                  env=dict(os.environ), out=tmp_path / "p.txt",
                                  timeout=120) == 0


def test_switched_off_the_caller_starts_its_own(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               fresh_interpreter: Callable[..., tuple[int, str]]
                                               ) -> None:
    monkeypatch.setenv("MEMWATCH_TEST_NO_ZYGOTE", "1")
    script = _script(tmp_path, "import sys\nprint('plain', sys.argv[1])\n")
    assert zygote.run("script", [str(script), "x"], source=script, cwd=tmp_path,
                                  env=dict(os.environ), out=tmp_path / "o.txt",
                                  timeout=60) is None
    rc, out = fresh_interpreter("script", [str(script), "x"], source=script, cwd=tmp_path,
                                env=dict(os.environ))
    assert rc == 0 and "plain x" in out


def test_a_zygote_that_dies_under_a_child_hands_the_run_back(tmp_path: Path) -> None:
    """Not a timeout: the caller is told to run it in an interpreter of its own (None)."""
    import threading

    script = _script(tmp_path, "import time\ntime.sleep(60)\n")
    client = zygote._Client(zygote.preload_for("script", script))  # its own: no other is killed
    assert client._start() and client.proc is not None
    threading.Timer(3, client.proc.kill).start()
    assert client.run("script", [str(script)], tmp_path, dict(os.environ), tmp_path / "o.txt",
                      120) is None
    assert client.broken


def test_a_child_reads_its_warning_filters_and_ends_as_an_interpreter(tmp_path: Path) -> None:
    """What a new interpreter does with ``PYTHONWARNINGS`` and at its end, a forked child does
    too: the filters apply (a warning is an error), and before it exits its non-daemon threads
    finish and its ``atexit`` functions run."""
    script = _script(tmp_path, "import atexit, sys, threading, time, warnings\n"
                               "print('options', sys.warnoptions)\n"
                               "try:\n"
                               "    warnings.warn('boom', UserWarning)\n"
                               "    print('not raised')\n"
                               "except UserWarning:\n"
                               "    print('raised')\n"
                               "threading.Thread(target=lambda: (time.sleep(0.5),\n"
                               "                                 print('thread done'))).start()\n"
                               "atexit.register(lambda: print('atexit ran', flush=True))\n")
    out = tmp_path / "o.txt"
    assert zygote.run("script", [str(script)], source=script, cwd=tmp_path,
                      env={**os.environ, "PYTHONWARNINGS": "error"}, out=out, timeout=120) == 0
    text = out.read_text()
    lines = text.splitlines()
    assert "options ['error']" in lines and "raised" in lines, text
    assert lines.index("thread done") < lines.index("atexit ran"), text
    # and a failing script's exit raises, with its output
    bad = _script(tmp_path, "raise SystemExit('no good')\n")
    with pytest.raises(RuntimeError, match="exited 1:\n.*no good"):
        zygote.script(bad, [], cwd=tmp_path, timeout=120)
