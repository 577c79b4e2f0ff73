"""Tabulate docs/experiments/results/*.json (written by oom_driver.py) as Markdown.

    python docs/experiments/summarize.py [RESULTS_DIR]

Pids are replaced by N in messages so that identical outcomes count together.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import sys
from pathlib import Path


def norm(s: str) -> str:
    return re.sub(r"\d{3,}", "N", s).strip()


def med(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def main() -> None:
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results"
    for f in sorted(d.glob("*.json")):
        doc = json.loads(f.read_text())
        s = doc["summary"]
        a = doc["args"]
        print(f"### {f.stem}\n")
        flags = "--loader-thread" if a.get("loader_thread") else ""
        print(
            f"`oom_driver.py {a['mode']} --limit-mib {a['limit_mib']} --sleep-item "
            f"{a['sleep_item']} --compute {a.get('compute', 0)} {flags}` x {len(s)} runs, "
            f"kernel {doc['kernel']}\n"
        )
        rc = collections.Counter(r["returncode"] for r in s)
        who = collections.Counter("+".join(v["who"] for v in r["victims"]) or "none" for r in s)
        kills = collections.Counter(r["oom_kills_delta"] for r in s)
        parent = collections.Counter(r["parent_oom_kills_delta"] for r in s)
        print(f"- exit status of the main process: {dict(rc)}")
        print(
            f"- victims (kernel log): {dict(who)}; child cgroup oom_kill delta: {dict(kills)};"
            f" parent (own) cgroup delta: {dict(parent)}"
        )
        chains = collections.Counter(
            " <- ".join(norm(c) for c in r["chain"]) or "(none)" for r in s
        )
        print("- exception chains seen by the main process (outermost first):")
        for c, n in chains.most_common():
            print(f"  - {n}x `{c}`")
        raised = collections.Counter(
            (r["where"], r["raised_in"][-1] if r["raised_in"] else "-") for r in s
        )
        print("- where the loop was / innermost frame of the outer exception:")
        for (w, fr), n in raised.most_common():
            print(f"  - {n}x {w} / `{fr}`")
        print(
            f"- kill -> oom_kill counter seen (ms): "
            f"{med([r.get('kill_to_counter_seen_ms') for r in s])}"
        )
        print(
            f"- kill -> first SIGCHLD in main (ms): "
            f"{med([r.get('kill_to_first_sigchld_ms') for r in s])}"
        )
        print(
            f"- kill -> exception in main (ms): {med([r.get('kill_to_exception_ms') for r in s])}"
        )
        print(
            f"- start -> kill (s): {med([r.get('start_to_kill_s') for r in s])}; steps: "
            f"{med([r.get('steps') for r in s])}"
        )
        left = [r["pids_left_after_s"] for r in s]
        print(
            f"- processes left in the cgroup after the main process ended, gone after (s): {left}\n"
        )


if __name__ == "__main__":
    main()
