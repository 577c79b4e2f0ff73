"""Running the example scripts of ``examples/run/`` as they are, bare and under ``memwatch run``,
several at once (each test starts its runs together and then waits: the twins share the
machine's cores instead of taking turns)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PY = sys.executable
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "run"
#: A check every 32 optimizer steps: a leak that starts at the first step is confirmed at the
#: second or third check. (With 16, memwatch's own allocations at its first checks, a few MiB
#: while its census and summaries warm up, are sometimes judged a leak of a clean run when
#: mw.step() runs inside optimizer.step(): an analyzer issue, reported.) No DataLoader workers to
#: sample; a tables-only report (the charts' 5 MB of plotly.js show nothing more here).
FAST = ("--check-every-n-steps", "32", "--no-workers", "--report", "tables")
ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}


@dataclasses.dataclass
class Run:
    """One finished run: its exit code, stdout, stderr and folder."""

    name: str
    rc: int
    out: str
    err: str
    cwd: Path

    def memwatch_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.startswith("memwatch")]

    def verdicts(self) -> list[str]:
        """The console's verdict lines (``check N at step S: kind in metric ...``)."""
        return [ln for ln in self.memwatch_lines() if re.search(r": check \d+ at step \d+: ", ln)]

    def explain(self) -> str:
        return f"[{self.name}] rc={self.rc}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n" \
               f"{self.err[-6000:]}"


@dataclasses.dataclass
class Spec:
    """A run to start: ``memwatch`` None runs the script bare, else with those options."""

    name: str
    command: Sequence[str]
    memwatch: Sequence[str] | None = None
    preexec: Callable[[], Any] | None = None


def script(name: str) -> str:
    return str(EXAMPLES / name)


def run_together(tmp: Path, *specs: Spec, timeout: float = 240) -> dict[str, Run]:
    """Start every run at once (each in its own folder under ``tmp``), wait for all."""
    procs = []
    for s in specs:
        cwd = tmp / s.name
        cwd.mkdir(parents=True, exist_ok=True)
        cmd = list(s.command) if s.memwatch is None else \
            [PY, "-m", "memwatch", "run", *s.memwatch, "--", *s.command]
        out, err = open(cwd / "stdout", "w"), open(cwd / "stderr", "w")  # noqa: SIM115
        env = {**os.environ, **ENV}
        # A session of its own: a run that hangs is ended with every process it started (a
        # launcher's ranks included).
        procs.append((s, cwd, out, err, subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=err, env=env, preexec_fn=s.preexec,
            start_new_session=True)))
    runs = {}
    try:
        for s, cwd, _, _, p in procs:
            rc = p.wait(timeout=timeout)
            runs[s.name] = Run(s.name, rc, (cwd / "stdout").read_text(),
                               (cwd / "stderr").read_text(), cwd)
    finally:
        for _, _, out, err, p in procs:
            if p.poll() is None:  # a run that hung: ended with its process group
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.close()
            err.close()
    return runs


def assert_leak_found(run: Run, holder: str, label: str = "") -> str:
    """The run reported a leak of host memory at a check, naming ``holder``; returns the line."""
    lines = [ln for ln in run.verdicts() if f"{label}: check " in ln and "leak in host." in ln
             and holder in ln]
    assert run.rc == 0 and lines, run.explain()
    return lines[0]


def assert_quiet(run: Run) -> None:
    """No verdict line at all, and a summary saying so."""
    assert run.rc == 0, run.explain()
    assert run.verdicts() == [], run.explain()
    assert any("no leak, no warning" in ln for ln in run.memwatch_lines()), run.explain()


def check_number(line: str) -> int:
    m = re.search(r"check (\d+) at step (\d+)", line)
    assert m, line
    return int(m.group(1))
