"""How a bundle is announced: one line per bundle, with a command that runs as printed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.runtime.announce import announce_bundle, cli_command, cli_line

VENV_BIN = Path(sys.executable).parent


@pytest.mark.skipif(not (VENV_BIN / "memwatch").is_file(), reason="no console script installed "
                    "beside this interpreter (an installed package always has one)")
def test_the_command_is_the_one_that_runs_here(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Not on PATH (an environment made by `make venv`, not activated): the script's path,
    # relative when it lies below the working directory.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(VENV_BIN.parent.parent)
    rel = os.path.relpath(VENV_BIN / "memwatch")
    assert cli_command() == (rel if not rel.startswith("..") else str(VENV_BIN / "memwatch"))
    monkeypatch.chdir(tmp_path)
    assert cli_command() == str(VENV_BIN / "memwatch")
    # On PATH as this interpreter's own script: its plain name.
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    assert cli_command() == "memwatch"
    # Each runs as printed (through a shell, from where it was printed).
    for path in ("/usr/bin:/bin", f"{VENV_BIN}:/usr/bin:/bin"):
        monkeypatch.setenv("PATH", path)
        r = subprocess.run(cli_line("ls", tmp_path / "a dir"), shell=True, capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PATH=path))
        assert r.returncode == 2 and "a dir: no such directory" in r.stderr, r.stderr


def test_without_a_console_script_it_is_python_dash_m(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "python"
    monkeypatch.setattr(sys, "executable", str(fake))
    assert cli_command() == f"{fake} -m memwatch"
    assert cli_line("inspect", tmp_path / "x y") == f"{fake} -m memwatch inspect '{tmp_path}/x y'"


class _RefusesNotes(Exception):
    def add_note(self, note: str) -> None:
        raise TypeError("no notes here")


def test_one_line_per_bundle(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="memwatch")
    exc = RuntimeError("CUDA out of memory")
    announce_bundle(tmp_path / "b1", "exception", exc)
    assert caplog.records == []  # the note under the traceback is its line
    (note,) = exc.__notes__
    assert note.startswith(f"memwatch: diagnostic bundle written to {tmp_path / 'b1'} "
                           f"(look inside: {cli_command()} inspect ")
    announce_bundle(tmp_path / "b2", "exception", _RefusesNotes())
    announce_bundle(tmp_path / "b3", "end_of_run")
    # An end-of-run bundle is no failure: one line at level INFO, saying what it is.
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"memwatch: exception bundle written to {tmp_path / 'b2'}"),
        ("INFO", "memwatch: the run's report and snapshot for the sinks written to "
                 f"{tmp_path / 'b3'}")]
