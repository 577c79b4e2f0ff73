"""The start-up shim in real interpreters (no torch: each child starts in a fraction of a second).

What it must do in every process of the watched command: run the user's own ``sitecustomize``
as Python would, leave ``sys.path``, the exit code and the output as they were, and install its
post-import hook only in the process that runs the training script (not in a ``-c`` child, a
spawn worker or another script the training script starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.autorun.launch import SHIM_DIR, child_env
from memwatch.autorun.plan import Plan, Target

PY = sys.executable

PROBE = """
import json, os, subprocess, sys
def state():
    return {"hooked": any(type(f).__name__ == "PostImport" for f in sys.meta_path),
            "shim_on_path": any(os.path.realpath(p or ".") == os.path.realpath(%(shim)r)
                                for p in sys.path),
            "user_sc": os.environ.get("USER_SC_RAN"),
            "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None)}
if "--child" in sys.argv:
    print(json.dumps(state()))
    sys.exit(0)
me = state()
kids = [json.loads(subprocess.run(c, capture_output=True, text=True).stdout) for c in (
    [sys.executable, "-c", "import runpy, sys; sys.argv = ['x', '--child']; "
                           "runpy.run_path(%(script)r, run_name='__main__')"],
    [sys.executable, %(other)r, "--child"],
)]
print(json.dumps({"me": me, "kids": kids}))
print("stderr line", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    script, other = tmp_path / "train.py", tmp_path / "other.py"
    code = PROBE % {"shim": SHIM_DIR, "script": str(script), "other": str(other)}
    script.write_text(code)
    other.write_text(code)
    return script, other


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def test_only_the_training_scripts_process_is_hooked_and_nothing_else_changes(
        scripts: tuple[Path, Path], tmp_path: Path) -> None:
    script, _ = scripts
    base = {**os.environ, "EXIT_CODE": "3"}
    bare = _run([PY, "train.py"], base, tmp_path)
    env = child_env(base, Plan(Target(script=str(script)), {}))
    watched = _run([PY, "train.py"], env, tmp_path)
    assert bare.returncode == watched.returncode == 3
    assert bare.stderr == watched.stderr == "stderr line\n"  # nothing imported torch: silent
    got = json.loads(watched.stdout)
    assert got["me"]["hooked"] and not got["me"]["shim_on_path"]
    # The children inherit the environment but do not run the training script's main file.
    assert [k["hooked"] for k in got["kids"]] == [False, False]
    assert not any(k["shim_on_path"] for k in got["kids"])
    assert json.loads(bare.stdout)["me"]["hooked"] is False


def test_the_users_own_sitecustomize_still_runs(scripts: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    script, _ = scripts
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SC_RAN'] = 'yes'\n")
    base = {**os.environ, "PYTHONPATH": str(user)}
    bare = json.loads(_run([PY, "train.py"], base, tmp_path).stdout)
    env = child_env(base, Plan(Target(script=str(script)), {}))
    got = json.loads(_run([PY, "train.py"], env, tmp_path).stdout)
    assert bare["me"]["user_sc"] == got["me"]["user_sc"] == "yes"
    assert got["me"]["sitecustomize"] == bare["me"]["sitecustomize"] == str(
        user / "sitecustomize.py")
    assert [k["user_sc"] for k in got["kids"]] == ["yes", "yes"]
    assert got["me"]["hooked"]


def test_a_failing_user_sitecustomize_is_reported_as_python_reports_it(
        scripts: tuple[Path, Path], tmp_path: Path) -> None:
    script, _ = scripts
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    base = {**os.environ, "PYTHONPATH": str(user)}
    bare = _run([PY, "train.py"], base, tmp_path)
    env = child_env(base, Plan(Target(script=str(script)), {}))
    watched = _run([PY, "train.py"], env, tmp_path)
    assert "Error in sitecustomize" in bare.stderr and "broken site" in bare.stderr
    assert watched.stderr == bare.stderr and watched.returncode == bare.returncode == 0
    assert json.loads(watched.stdout)["me"]["hooked"]  # still watched


def test_a_module_target_is_watched_under_dash_m(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        "import sys\nprint(any(type(f).__name__ == 'PostImport' for f in sys.meta_path))\n")
    env = child_env(os.environ, Plan(Target(module="pkg.train"), {}))
    assert _run([PY, "-u", "-m", "pkg.train"], env, tmp_path).stdout == "True\n"
    assert _run([PY, "-c", "import pkg.train"], env, tmp_path).stdout == "False\n"


def test_memwatch_run_keeps_the_exit_code_stdout_and_pid(tmp_path: Path) -> None:
    """Through the CLI: the command is exec'd (same pid, same exit code, same output)."""
    (tmp_path / "t.py").write_text(
        "import os, sys\nprint('pid', os.getpid(), 'ppid', os.getppid())\nsys.exit(7)\n")
    r = _run([PY, "-m", "memwatch", "run", "--", PY, "t.py"], dict(os.environ), tmp_path)
    assert r.returncode == 7, r.stderr
    assert r.stderr == ""  # no torch, nothing watched, nothing said
    pid, ppid = int(r.stdout.split()[1]), int(r.stdout.split()[3])
    assert ppid == os.getpid() and pid > 0  # the script is the process the test started
