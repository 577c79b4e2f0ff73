"""Every script in ``examples/`` runs to completion, so examples cannot rot.

Each runs in a process of its own, as ``python examples/<name>.py`` would (forked from the
worker's zygote, which has imported only torch, the frameworks the script names and memwatch:
``tests/zygote.py``), with ``MEMWATCH_EXAMPLE_QUICK=1`` (an example's cue to use a tiny
configuration) and its working directory in a temporary folder (where it writes its output).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def _run(fresh: Callable[..., tuple[int, str]], script: Path, cwd: Path, *args: str) -> str:
    env = dict(os.environ, MEMWATCH_EXAMPLE_QUICK="1", WANDB_MODE="offline",
               HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    rc, out = fresh("script", [str(script), *args], source=script, cwd=cwd, env=env)
    assert rc == 0, f"{script.name} failed:\n{out}"
    return out


def test_the_examples_are_collected() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"plain_loop.py", "demo.py"} <= names


# What a few examples must print, beyond exiting cleanly.
EXPECTED = {
    "plain_loop": ["epoch 0: mean loss", "epoch 1: mean loss", "latest(): ", "host.rss",
                   "finding(s) in total"],
    "demo": ["planted leak", "epoch 1: mean loss"],
    # A loop of unknown length at the defaults: judged by exit, its dict named, its answer left.
    "run_answer": ["leak in host.rss, held by run_answer.cache", "1200 steps",
                   "exit: completed", "memwatch-answer/report.html"],
}


@pytest.mark.slow  # one interpreter (torch import, DataLoader workers) per example
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script: Path, tmp_path: Path,
                      fresh_interpreter: Callable[..., tuple[int, str]]) -> None:
    pytest.importorskip("torch")
    out = _run(fresh_interpreter, script, tmp_path)
    for text in EXPECTED.get(script.stem, []):
        assert text in out, f"{script.name} did not print {text!r}:\n{out}"
    if script.stem == "lightning_demo":
        # The commands it prints to look at the bundle run as printed, from where it ran; so do
        # the README's, from a checkout where `make demo` ran (its .venv is this interpreter's).
        cmds = [ln.split(":", 1)[1].strip() for ln in out.splitlines()
                if ln.lstrip().startswith(("look inside:", "as a web page:"))]
        assert len(cmds) == 2, out
        readme = (EXAMPLES.parent / "README.md").read_text()
        from_readme = re.findall(r"^(\.venv/bin/memwatch [^#\n]*?)\s*(?:#.*)?$", readme, re.M)
        assert len(from_readme) == 2, from_readme
        (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
        for cmd in cmds + from_readme:
            r = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, (cmd, r.stderr)
