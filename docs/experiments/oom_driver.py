"""Run ``oom_train.py`` in a fresh memory-limited child cgroup, several times, and record who died.

    PYTHONPATH=src python docs/experiments/oom_driver.py MODE [--runs 5] [--limit-mib 1024]
        [--sleep-item 0.05] [--compute 0] [--loader-thread] [--out FILE.json]

Each run: a child cgroup under this process's own memory cgroup (tests/cgroup_helpers.py), the
training script started inside it (bounded by --timeout, killed past it), then: its exit status,
the child cgroup's ``oom_kill`` counter before/after, the kernel's OOM report from ``/dev/kmsg``
(victim pid and name, ``oom_memcg``/``task_memcg``), the main process's own report (exceptions,
timings), and for how long processes stayed in the cgroup after the main process ended (orphaned
workers). The cgroup is removed after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "src")]

from cgroup_helpers import MIB, ChildCgroup, KernelLog  # noqa: E402

KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")
MEMCG = re.compile(r"oom_memcg=([^,]+),task_memcg=([^,]+),task=([^,]+),pid=(\d+)")


def kmsg_offset() -> float | None:
    """``time.monotonic()`` minus the ``/dev/kmsg`` clock, measured by logging a line."""
    log = KernelLog()
    if not log.readable:
        return None
    try:
        t0 = time.monotonic()
        with open("/dev/kmsg", "w") as f:
            f.write("memwatch: clock check\n")
        t1 = time.monotonic()
        for ts, msg in log.read():
            if "memwatch: clock check" in msg:
                return (t0 + t1) / 2 - ts
    except OSError:
        return None
    finally:
        log.close()
    return None


def one_run(i: int, a: argparse.Namespace) -> dict[str, Any]:
    out = Path(a.tmpdir) / f"run{i}.json"
    res: dict[str, Any] = {"run": i, "limit_mib": a.limit_mib}
    with ChildCgroup(a.limit_mib * MIB) as cg:
        assert cg.parent is not None
        res["cgroup"] = cg.path
        res["swap_guard"] = cg.swap_guard
        parent_before = ChildCgroup.parent_oom_kills(cg.parent)
        before = cg.oom_kills()
        kmsg = KernelLog()
        t0 = time.monotonic()
        argv = [
            sys.executable,
            str(HERE / "oom_train.py"),
            a.mode,
            str(out),
            cg.path,
            "--sleep-item",
            str(a.sleep_item),
            "--max-seconds",
            str(a.max_seconds),
            "--compute",
            str(a.compute),
        ] + (["--loader-thread"] if a.loader_thread else [])
        with open(str(out) + ".stderr", "w") as err:
            proc = cg.popen(argv, stdout=err, stderr=subprocess.STDOUT)
            res["main_pid"] = proc.pid
            try:
                rc = proc.wait(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
                res["timed_out"] = True
        t_end = time.monotonic()
        res["returncode"] = rc
        res["wall_s"] = round(t_end - t0, 3)
        # Orphans: what stays in the cgroup after the main process ended, and for how long.
        left = cg.pids()
        res["pids_left_at_main_exit"] = left
        while left and time.monotonic() - t_end < a.linger:
            time.sleep(0.05)
            left = cg.pids()
        res["pids_left_after_s"] = None if left else round(time.monotonic() - t_end, 2)
        res["pids_killed_by_cleanup"] = left
        time.sleep(0.2)
        res["oom_kills_delta"] = cg.oom_kills() - before
        res["parent_oom_kills_delta"] = ChildCgroup.parent_oom_kills(cg.parent) - parent_before
        lines = [(ts, m) for ts, m in kmsg.read() if cg.name in m or "Killed process" in m]
        kmsg.close()
        res["kmsg"] = [m for _, m in lines]
        res["victims"] = []
        for ts, m in lines:
            k = KILLED.search(m)
            if k:
                res["victims"].append({"pid": int(k.group(1)), "comm": k.group(2), "kmsg_ts": ts})
            mc = MEMCG.search(m)
            if mc:
                res["oom_memcg"], res["task_memcg"] = mc.group(1), mc.group(2)
    stderr = Path(str(out) + ".stderr").read_text(errors="replace")
    res["stderr_tail"] = stderr[-3000:]
    if out.exists():
        res["report"] = json.loads(out.read_text())
    return res


def summarize(res: dict[str, Any], offset: float | None) -> dict[str, Any]:
    rep = res.get("report", {})
    workers = rep.get("worker_pids", [])
    s: dict[str, Any] = {
        "run": res["run"],
        "returncode": res["returncode"],
        "oom_kills_delta": res["oom_kills_delta"],
        "parent_oom_kills_delta": res["parent_oom_kills_delta"],
        "victims": [
            {
                **v,
                "who": "main"
                if v["pid"] == res["main_pid"]
                else ("worker" if v["pid"] in workers else "other"),
            }
            for v in res["victims"]
        ],
        "steps": rep.get("steps"),
        "where": rep.get("where"),
        "chain": [f"{c['relation']}: {c['type']}: {c['message']}" for c in rep.get("chain", [])],
        "raised_in": (rep.get("chain") or [{}])[0].get("frames", [])[-3:],
        "pids_left_after_s": res["pids_left_after_s"],
        "shutdown_s": rep.get("shutdown_s"),
    }
    if offset is not None and res["victims"] and rep:
        t_kill = res["victims"][0]["kmsg_ts"] + offset  # on the monotonic clock
        if "t_exception" in rep:
            s["kill_to_exception_ms"] = round((rep["t_exception"] - t_kill) * 1e3, 1)
        if "t_oom_counter" in rep:
            s["kill_to_counter_seen_ms"] = round((rep["t_oom_counter"] - t_kill) * 1e3, 1)
        if rep.get("sigchld"):
            s["kill_to_first_sigchld_ms"] = round((rep["sigchld"][0]["t"] - t_kill) * 1e3, 1)
        s["start_to_kill_s"] = round(t_kill - rep["t_start"], 2)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "main"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--sleep-item", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--compute", type=int, default=0)
    ap.add_argument("--loader-thread", action="store_true")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--linger", type=float, default=15.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.out = a.out or str(HERE / "results" / f"{a.mode}.json")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    offset = kmsg_offset()
    runs, summary = [], []
    with tempfile.TemporaryDirectory() as tmp:
        a.tmpdir = tmp
        for i in range(a.runs):
            res = one_run(i, a)
            runs.append(res)
            summary.append(summarize(res, offset))
            print(json.dumps(summary[-1]), flush=True)
    del a.tmpdir
    doc = {
        "args": vars(a),
        "kernel": os.uname().release,
        "kmsg_offset_s": offset,
        "summary": summary,
        "runs": runs,
    }
    Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
