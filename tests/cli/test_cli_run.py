"""``memwatch run``: its options (validated as ``watch()`` validates them, one line and exit code 2
for a bad value, the script never started), how it finds the training script in a command, the
plan it passes in the environment, and ``--dry-run``.

Everything here runs in this process or in children that import no torch; the real training
scripts run under ``memwatch run`` in ``integrations/run/``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.autorun import plan as plan_mod
from memwatch.autorun.launch import SHIM_DIR, child_env, find_target, target_from
from memwatch.autorun.plan import ENV, Plan, Target, read_plan
from memwatch.autorun.shim import sitecustomize as shim
from memwatch.cli import COMMANDS, main
from memwatch.cli.run import OPTIONS
from memwatch.core.errors import ConfigError

PY = sys.executable


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A script that leaves a marker when it runs (it must not, whenever the options are bad)."""
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "train.py"
    p.write_text("import torch\nimport lightning.pytorch as L\nopen('ran', 'w').close()\n")
    return p


@pytest.mark.parametrize("args,names", [
    (["--check-every-n-steps", "3"], ["--check-every-n-steps 3", "check_every_n_steps=3",
                                      ">= 16"]),
    (["--check-every-n-steps", "many"], ["--check-every-n-steps 'many'", "whole number",
                                         "5000"]),
    (["--check-every-s", "-1"], ["--check-every-s -1", "positive"]),
    (["--interval-s", "0"], ["--interval-s 0", "interval_s=0", "positive"]),
    (["--device", "tpu"], ["--device tpu", "device='tpu'", "'cuda:N'"]),
    (["--census", "sometimes"], ["--census sometimes", "'auto'"]),
    (["--tracemalloc", "999"], ["--tracemalloc 999", "1 to 256"]),
    (["--tracemalloc", "python"], ["--tracemalloc 'python'", "put -- before the command"]),
    (["--bundle-on", "oom,gpu"], ["--bundle-on oom,gpu", "'gpu' is not a trigger"]),
    (["--out-dir", ""], ["--out-dir", "out_dir='' is empty"]),
])
def test_a_bad_option_is_one_line_naming_it_with_exit_2_and_nothing_runs(
        script: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        names: list[str]) -> None:
    assert main(["run", *args, "--", PY, str(script)]) == 2
    line = _err_line(capsys)
    assert line.startswith("memwatch run: error: "), line
    for name in names:
        assert name in line, (name, line)
    assert not (script.parent / "ran").exists()


def test_a_command_that_cannot_run_is_refused_before_anything_starts(
        script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    assert "no command to run" in _err_line(capsys)
    assert main(["run", "--", "no-such-launcher-xyz", "train.py"]) == 2
    assert "'no-such-launcher-xyz': command not found" in _err_line(capsys)
    assert main(["run", "--", PY, "-c", "print(1)"]) == 2
    assert "--target" in _err_line(capsys)  # -c runs no script: say how to name one
    assert main(["run", "--target", "no/such.py", "--", PY, "-c", "1"]) == 2
    assert "neither a file nor a module name" in _err_line(capsys)


def test_dry_run_says_what_would_be_attached_and_the_options_and_runs_nothing(
        script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--check-every-n-steps", "100", "--tracemalloc",
                 "--no-workers", "--", PY, "train.py", "--lr", "1"]) == 0
    out = capsys.readouterr().out
    assert not (script.parent / "ran").exists()
    assert f"the script {script.resolve()}" in out
    assert "imports:  torch, lightning (read from its source; nothing ran)" in out
    assert "Lightning: a memwatch.integrations.lightning.MemWatchCallback" in out
    assert "transformers:" not in out  # the script does not import it
    assert "every step of the first optimizer that steps" in out
    assert "checks every 100 steps / every 600 s" in out
    rows = {m[3]: (m[1] == "*", m[2]) for m in re.finditer(
        r"^  ([* ]) \w+ = (.*?)  \((--[\w-]+)\)$", out, re.M)}
    assert rows["--check-every-n-steps"] == (True, "100")  # given here
    assert rows["--tracemalloc"] == (True, "True")
    assert rows["--check-every-s"] == (False, "600.0")  # a default, resolved
    assert rows["--warn"] == (False, "False")  # memwatch run's own default
    assert rows["--no-workers"] == (True, "False")  # workers = False
    assert set(rows) == {flag for flag, *_ in OPTIONS} | {"--report"}
    env = next(ln for ln in out.splitlines() if ln.startswith("environment:"))
    doc = json.loads(env.split(f"{ENV}=", 1)[1])
    assert doc["options"] == {"check_every_n_steps": 100, "tracemalloc": True,
                              "workers": False}
    assert doc["target"] == {"script": str(script.resolve())}


@pytest.mark.parametrize("command,expected", [
    (["python", "train.py", "--lr", "1"], Target(script="train.py")),
    (["python3.11", "-u", "-W", "ignore", "-X", "dev", "train.py"], Target(script="train.py")),
    (["python", "-m", "pkg.train", "--cfg", "train.py"], Target(module="pkg.train")),
    (["python", "-um", "pkg.train"], Target(module="pkg.train")),
    (["python", "-mpkg.train"], Target(module="pkg.train")),
    (["torchrun", "--nproc-per-node", "2", "train.py", "--epochs", "3"],
     Target(script="train.py")),
    (["torchrun", "--nproc-per-node=2", "-m", "pkg.train"], Target(module="pkg.train")),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py"],
     Target(script="train.py")),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"],
     Target(script="train.py")),
    (["./train.py", "--lr", "1"], Target(script="train.py")),
    (["python", "-c", "import train"], None),
    (["python"], None),
    (["torchrun", "--standalone", "missing.py"], None),
])
def test_the_training_script_is_found_in_the_command(
        script: Path, command: list[str], expected: Target | None) -> None:
    got = find_target(command, str(script.parent))
    if expected is not None and expected.script:
        expected = Target(script=str(script.resolve()))
    assert got == expected


def test_target_option_names_a_script_or_a_module(script: Path) -> None:
    assert target_from("train.py", str(script.parent)) == Target(script=str(script.resolve()))
    assert target_from("pkg.train", str(script.parent)) == Target(module="pkg.train")
    with pytest.raises(ConfigError, match="neither a file nor a module"):
        target_from("not a module!", str(script.parent))


@pytest.mark.parametrize("argv,orig,expected", [
    (["train.py", "--lr"], ["python", "train.py", "--lr"], ("script", "train.py")),
    (["-m"], ["python", "-u", "-W", "error", "-m", "pkg.train", "x"], ("module", "pkg.train")),
    (["-m"], ["python", "-X", "importtime", "-um", "pkg.train"], ("module", "pkg.train")),
    (["-m"], ["python", "-Wignore", "-mpkg.train"], ("module", "pkg.train")),
    (["-c"], ["python", "-c", "from multiprocessing.spawn import spawn_main"], None),
    ([""], ["python"], None),
    ([], ["python"], None),
])
def test_each_process_knows_what_it_runs(script: Path, argv: list[str], orig: list[str],
                                         expected: tuple[str, str] | None) -> None:
    got = shim.main_of(argv, orig)
    if expected is not None and expected[0] == "script":
        expected = ("script", str(script.resolve()))
    assert got == expected


def test_only_the_target_process_is_watched(script: Path) -> None:
    plan = json.loads(Plan(Target(script=str(script)), {}).encode())
    assert shim.is_target(plan, ["train.py"], ["python", "train.py"])
    assert shim.is_target(plan, [str(script)], ["python", "-u", str(script)])
    assert not shim.is_target(plan, ["other.py"], ["python", "other.py"])
    assert not shim.is_target(plan, ["-c"], ["python", "-c", "pass"])  # spawn workers, pip...
    mod = json.loads(Plan(Target(module="pkg.train"), {}).encode())
    assert shim.is_target(mod, ["-m"], ["python", "-m", "pkg.train"])
    assert not shim.is_target(mod, ["-m"], ["python", "-m", "pip", "install"])
    assert not shim.is_target(None, ["train.py"], ["python", "train.py"])
    assert not shim.is_target({"target": "train.py"}, ["train.py"], ["python", "train.py"])


def test_the_plan_round_trips_and_a_bad_one_is_refused() -> None:
    plan = Plan(Target(module="pkg.train"), {"check_every_n_steps": 100, "bundle_on": ["oom"],
                                             "run_report": "tables"})
    assert read_plan(json.loads(plan.encode())) == plan
    with pytest.raises(ValueError, match="version 2"):
        read_plan({"version": 99})
    with pytest.raises(ValueError, match="malformed"):
        read_plan({"version": 2, "target": {}, "options": []})
    # The shim (which imports nothing of memwatch) reads the same variable.
    assert shim.ENV == ENV == plan_mod.ENV


def test_the_environment_puts_the_shim_first_and_keeps_the_rest(tmp_path: Path) -> None:
    plan = Plan(Target(script="/x/train.py"), {"out_dir": "o"})
    env = child_env({"PYTHONPATH": "/a:/b", "HOME": "/h"}, plan)
    assert env["PYTHONPATH"] == f"{SHIM_DIR}{os.pathsep}/a:/b" and env["HOME"] == "/h"
    assert json.loads(env[ENV])["options"] == {"out_dir": "o"}
    assert child_env({}, plan)["PYTHONPATH"] == SHIM_DIR
    assert Path(SHIM_DIR, "sitecustomize.py").is_file()


def test_python_dash_m_memwatch_runs_the_cli(tmp_path: Path) -> None:
    out = subprocess.run([PY, "-m", "memwatch", "run", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "memwatch run [OPTIONS] -- python train.py" in out.stdout
    bad = subprocess.run([PY, "-m", "memwatch", "run", "--census", "x", "--", PY, "t.py"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


@pytest.mark.parametrize("cmd", [["nonexistent_script.py"], ["python", "nonexistent_script.py"],
                                 ["torchrun", "--nproc-per-node", "2", "nonexistent_script.py"]])
def test_a_missing_script_is_said_to_be_missing(cmd: list[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--", *cmd]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nonexistent_script.py': no such file" in err[0], err


def test_help_prints_whole_command_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for cls in COMMANDS:
        assert " ".join((cls.__doc__ or "").split()) in out, cls.__name__
