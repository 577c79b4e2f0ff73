"""The time-boxed runner of ``make gpu-check`` (``gpu_check.py`` holds the parts and the plan).

A lent GPU machine gives a session 15 minutes in all, machine start included, so the check is one
call of a few minutes. Its parts run in three windows, each ending at a share of the budget
(:data:`WINDOW_END`): 1, alone and first; 2, side by side in a pool of child processes (nothing
there is timed); 3, alone and last (the timed runs). A part starts only while its window has
:data:`MIN_START_S` left, and its timeout is its box or what is left of its window, whichever is
less: a slow part is cut, not the whole call. The report is rewritten after every part, in
``out`` and in ``publish`` (the lent machine's ``$OUT``), so a call killed at its limit returns
what it finished.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a part that breaks is reported, the rest still runs
        return {"status": "failed", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:]}


@dataclass(frozen=True)
class Part:
    """One part of the check. ``window``: 1 (alone, first), 2 (side by side) or 3 (alone, last);
    ``box``: the most seconds it may take; ``run(timeout, device)``: its result; ``after``: a
    part whose result it reads; ``cpu``: it runs without CUDA too (on FakeDevice). Without CUDA
    the other parts are "not run", unless ``--rehearse`` starts them (the adapters then run small
    on the CPU)."""

    name: str
    what: str
    window: int
    box: int
    run: Callable[[int, str], dict[str, Any]]
    after: str | None = None
    cpu: bool = False


#: The end of each window as a share of ``--budget-s``: window 1 is short, window 2's children
#: run side by side, window 3 holds the timed runs.
WINDOW_END = {1: 0.15, 2: 0.5, 3: 1.0}
MIN_START_S = 15  # a part is not started with less than this left in its window


class Check:
    """Runs a plan within a budget and writes the report after every part."""

    def __init__(self, out: Path, publish: Path, budget_s: float, jobs: int, cuda: bool,
                 rehearse: bool, only: list[str], env: dict[str, Any],
                 render: Callable[[dict[str, Any]], str]) -> None:
        self.out, self.publish, self.budget, self.jobs = out, publish, budget_s, jobs
        self.cuda, self.rehearse, self.only = cuda, rehearse, only
        self.env, self.render = env, render
        self.t0 = time.monotonic()
        self.results: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()  # the pool's workers record and write

    def left(self, window: int) -> float:
        return self.t0 + WINDOW_END[window] * self.budget - time.monotonic()

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {msg}"
        with self._lock:
            print(line, flush=True)
            for d in {self.out, self.publish}:
                with open(d / "log.txt", "a") as f:
                    f.write(line + "\n")

    def skip_reason(self, part: Part) -> str | None:
        if self.only and not any(part.name.startswith(p) for p in self.only):
            return f"not selected (--only): {part.what}"
        if not self.cuda and not (part.cpu or (self.rehearse and part.window > 1)):
            return f"no CUDA device: {part.what}"
        if not self.cuda and part.name.endswith("_expandable"):
            # an environment variable of the CUDA allocator: on the CPU the part is its plain
            # twin again, which the rehearsal runs
            return f"no CUDA device (expandable segments are a CUDA allocator setting): {part.what}"
        return None

    def record(self, part: Part, result: dict[str, Any], seconds: float) -> None:
        result.setdefault("what", part.what)
        result["seconds"] = round(seconds, 1)
        with self._lock:
            self.results[part.name] = result
            self.say(f"{part.name}: {result['status']} ({seconds:.1f} s)"
                     + (f" - {result.get('error') or result.get('reason')}"
                        if result["status"] != "passed" else ""))
            self.write()

    def attempt(self, part: Part) -> None:
        """Run ``part`` now, if its window has time left, killed at its box or the window's end;
        record what it gave (or why it did not run)."""
        why = self.skip_reason(part)
        left = self.left(part.window)
        if why is None and left < MIN_START_S:
            why = f"its window had {max(left, 0):.0f} s left (time box): {part.what}"
        if why is not None:
            self.record(part, {"status": "not run", "reason": why}, 0.0)
            return
        timeout = int(min(part.box, left))
        self.say(f"{part.name}: started (box {timeout} s)")
        t = time.monotonic()
        result = guard(lambda: part.run(timeout, "cuda" if self.cuda else "cpu"))
        self.record(part, result, time.monotonic() - t)

    def run_side_by_side(self, parts: list[Part]) -> None:
        """``--jobs`` parts at a time, each started when a worker takes it; a part with
        ``after`` is queued once that part is recorded."""
        waiting = [p for p in parts if p.after is not None]
        with cf.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            running = {pool.submit(self.attempt, p): p for p in parts if p.after is None}
            while running:
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    part = running.pop(fut)
                    fut.result()
                    for w in [w for w in waiting if w.after == part.name]:
                        waiting.remove(w)
                        running[pool.submit(self.attempt, w)] = w
            for w in waiting:  # what they wait for was not in the plan
                self.attempt(w)

    def run(self, parts: list[Part]) -> dict[str, Any]:
        self.say(f"gpu-check: {self.env.get('device') or 'no CUDA device'}, torch "
                 f"{self.env.get('torch')}, budget {self.budget:.0f} s, {self.jobs} jobs")
        for part in (p for p in parts if p.window == 1):
            self.attempt(part)
        self.run_side_by_side([p for p in parts if p.window == 2])
        for part in (p for p in parts if p.window == 3):
            self.attempt(part)
        self.say(f"done in {time.monotonic() - self.t0:.0f} s")
        return self.doc()

    def doc(self) -> dict[str, Any]:
        return {"environment": self.env, "budget_s": self.budget,
                "elapsed_s": round(time.monotonic() - self.t0, 1), "parts": self.results}

    def write(self) -> None:
        with self._lock:
            doc = self.doc()
            text = json.dumps(doc, indent=1, default=str)
        for d in {self.out, self.publish}:
            (d / "report.json").write_text(text)
            (d / "report.md").write_text(self.render(doc))
