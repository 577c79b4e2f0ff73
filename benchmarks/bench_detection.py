"""Detection benchmark: memwatch's verdicts on the corpus, against two naive rules.

Runs every scenario of ``benchmarks/scenarios/`` in its own process (host RSS must not carry over
from one scenario to the next), at most ``-j`` at a time, each under ``memwatch.watch`` (``cpu``
or a :class:`memwatch.testing.FakeDevice`, DataLoader workers watched where the loop has them,
background sampling every 50 ms). Each child reports the findings of every ``end_epoch()`` and the
raw per-step series of the watched metrics; the parent scores them:

* **memwatch**: a leak verdict is a finding of kind ``leak`` (or ``worker_growth``, the workers'
  form of a leak) on a metric with the scenario's prefix;
* **ratio rule**: "last value > 1.5 x first value";
* **Stormlog's rule**: average growth > 0, more than 70% of consecutive samples growing, and total
  growth > 100 MiB;

the naive rules are evaluated at every epoch end on the same series (everything sampled so far),
on every watched metric, so they get the same chances as memwatch.

Metrics: detection rate (a leak found by the end of the second epoch after it starts), false leak
verdicts on the controls, what the run believes at its end (``end``: the current belief of every
leak suspected, after the last check: a leak still believed, or withdrawn — growth that stopped,
a bounded container — see docs/findings.md#verdicts-are-beliefs; a control ends with none),
epochs to first detection, culprit accuracy (the scenario's expected
substring in ``culprit``), forecast error (``|predicted steps_to_oom - true remaining steps| /
true remaining steps`` at the epoch of first detection, for device series with a known OOM step).

Usage::

    python benchmarks/bench_detection.py            # full corpus, writes results/detection.json
    python benchmarks/bench_detection.py --quick    # shorter epochs (what CI runs)
    python benchmarks/bench_detection.py --only leak_slow --only ctrl_clean -j 1
    python benchmarks/bench_detection.py --quick --burners 2   # beside 2 busy-looping processes
    python benchmarks/bench_detection.py --quick --load-study --repeats 5 --burners 2
    python benchmarks/bench_detection.py --quick --split heldout   # the held-out reported bugs
    python benchmarks/bench_detection.py --quick --split all -j 1   # both parts of that corpus
    python benchmarks/bench_detection.py --quick --memwatch-src /tmp/base/src   # "before"

``--split design|heldout|all`` runs the reported-bug corpus only (the reproductions and their
twins of that part: ``design`` is what the rules are designed on, ``heldout`` is scored only
here, never by the tests) and prints its table per part; without it the whole design corpus runs.

``--load-study`` runs the corpus ``--repeats`` times quiet and as many times beside
``--burners`` busy-looping processes, interleaved, and prints what every run said about every
scenario (a verdict that changes with load is a bug); it writes ``results/detection_load.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import _common, _load, _reported, scenarios  # noqa: E402
from benchmarks.scenarios import Scenario  # noqa: E402

MiB = 1 << 20
#: Finding kinds that count as a leak verdict.
#: Epochs after the one where a leak starts by whose end it must be reported (issue 3's target).
DEADLINE_EPOCHS = 2

LEAK_KINDS = ("leak", "worker_growth")
#: Series the naive rules run on (whichever the scenario's session watches).
RULE_KEYS = ("host.rss", "host.uss", "workers.uss", "device.allocated", "device.reserved")
#: Also kept for the sanity checks and for reading the results by eye.
EXTRA_KEYS = ("workers.rss", "device.peak", "workers.count")
RESULTS = REPO / "benchmarks" / "results" / "detection.json"
LOAD_RESULTS = REPO / "benchmarks" / "results" / "detection_load.json"
CHILD_TIMEOUT_S = 300
DETECTORS = ("memwatch", "ratio_1.5x", "stormlog")
#: ``--memwatch-src``: the ``src`` folder whose memwatch the children run (None: this one's).
CHILD_SRC: str | None = None


# --------------------------------------------------------------------------- child side
def _jsonable(x: Any) -> Any:
    """``json.dumps`` default: numpy scalars and arrays, sets, anything else as text."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return repr(x)


def run_child(name: str, epochs: int, steps: int, out_path: str, analyze: bool = True,
              check_every: int | None = None) -> None:
    """Run one scenario under memwatch in this process and write its raw results as JSON."""
    import memwatch
    from memwatch.testing import FakeDevice

    mod = scenarios.load(name)
    sc: Scenario = mod.SCENARIO
    device: Any = FakeDevice(total_bytes=sc.device_total) if sc.device_total else "cpu"
    with tempfile.TemporaryDirectory(prefix="memwatch-bench-") as tmp:
        t0 = time.perf_counter()
        # Checks at epoch ends, plus every ``check_every`` steps inside them when asked; never
        # by the clock (a verdict must not depend on how fast the machine ran the loop).
        with memwatch.watch(device=device, workers=sc.workers, interval_s=0.05,
                            out_dir=tmp, analyze=analyze, check_every_n_steps=check_every,
                            check_every_s=None) as mw:
            # Time every end_epoch() (the analyzer's cost, census included): an instance
            # attribute shadows the method for this session only.
            end_epoch_s: list[float] = []
            real_end_epoch = mw.end_epoch

            def timed_end_epoch() -> list[Any]:
                t = time.perf_counter()
                try:
                    return real_end_epoch()
                finally:
                    end_epoch_s.append(time.perf_counter() - t)

            mw.end_epoch = timed_end_epoch  # type: ignore[method-assign]
            t_start = time.perf_counter()
            per_epoch = mod.run(mw, epochs, steps)
            t_run = time.perf_counter() - t0
            tl = mw.timeline
            assert tl is not None
            series: dict[str, list[float | None]] = {}
            step_axis: list[int] = []
            for key in RULE_KEYS + EXTRA_KEYS:
                if key in tl.keys:
                    st, vals = tl.series(key)
                    step_axis = st.tolist()
                    series[key] = [None if math.isnan(v) else float(v) for v in vals.tolist()]
            epochs_meta = [{"epoch": e.epoch, "start_step": e.start_step, "end_step": e.end_step,
                            "n_steps": e.n_steps, "seconds": e.t_end - e.t_start}
                           for e in mw.epochs]
            disabled = dict(mw.disabled)
            all_findings = [f.to_dict() for f in mw.findings]
            checks = mw.checks
            analyzer = type(mw.analyzer).__name__ if mw.analyzer is not None else None
    result = {
        "name": name,
        "epochs": epochs,
        "steps_per_epoch": steps,
        "findings": [[f.to_dict() for f in fs] for fs in per_epoch],
        # Every check's findings (epoch ends and checks inside epochs), with epoch/step/check.
        "all_findings": all_findings,
        "checks": checks,
        "check_every": check_every,
        "epoch_meta": epochs_meta,
        "steps": step_axis,
        "series": series,
        "disabled": disabled,
        "analyzer": analyzer,
        "run_s": t_run,
        "setup_s": t_start - t0,
        "end_epoch_s": end_epoch_s,
    }
    tmp_path = out_path + ".tmp"
    with open(tmp_path, "w") as f:
        json.dump(result, f, default=_jsonable)
    os.replace(tmp_path, out_path)


# --------------------------------------------------------------------------- parent side
def plan(sc: Scenario, quick: bool) -> tuple[int, int]:
    return (sc.quick_epochs, sc.quick_steps) if quick else (sc.epochs, sc.steps_per_epoch)


def run_one(sc: Scenario, quick: bool, timeout_s: float = CHILD_TIMEOUT_S,
            analyze: bool = True, check_every: int | None = None) -> dict[str, Any]:
    """Run one scenario in a fresh interpreter; returns its raw results (or an ``error``)."""
    epochs, steps = plan(sc, quick)
    with tempfile.TemporaryDirectory(prefix="memwatch-bench-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", sc.name,
               "--epochs", str(epochs), "--steps", str(steps), "--child-out", out]
        if not analyze:
            cmd.append("--no-analyze")
        if check_every:
            cmd += ["--check-every", str(check_every)]
        # One intra-op thread per child: two children share the 2 cores of a CI runner.
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if CHILD_SRC:  # a before/after comparison: the children run another checkout's memwatch
            env["PYTHONPATH"] = os.pathsep.join([CHILD_SRC, env.get("PYTHONPATH", "")])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"name": sc.name, "error": f"timed out after {timeout_s:.0f} s",
                    "wall_s": time.perf_counter() - t0}
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not os.path.exists(out):
            return {"name": sc.name, "error": f"exit {proc.returncode}: {proc.stderr[-3000:]}",
                    "wall_s": wall}
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
    res["wall_s"] = wall
    res["stderr_tail"] = proc.stderr[-2000:]
    return res


def run_corpus(names: Iterable[str] | None = None, quick: bool = False, jobs: int = 2,
               progress: bool = False, analyze: bool = True,
               check_every: int | None = None) -> dict[str, dict[str, Any]]:
    """Run the scenarios (all by default), ``jobs`` at a time; raw results by name.

    ``analyze=False`` records the raw series only (``memwatch.watch(analyze=False)``): no
    verdicts, and no census perturbing the heap at epoch ends.
    """
    todo = [scenarios.load(n).SCENARIO for n in (names or scenarios.NAMES)]
    # Longest first (real loops with workers, then real loops, then scripted series), so the
    # two lanes finish together.
    todo.sort(key=lambda s: (s.device_total is not None, not s.workers))
    out: dict[str, dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = {pool.submit(run_one, sc, quick, CHILD_TIMEOUT_S, analyze, check_every): sc
                for sc in todo}
        for fut in concurrent.futures.as_completed(futs):
            res = fut.result()
            out[res["name"]] = res
            if progress:
                status = "ERROR" if "error" in res else "ok"
                print(f"  {res['name']:<28} {status:<5} {res['wall_s']:6.1f} s", file=sys.stderr,
                      flush=True)
    return {n: out[n] for n in (names or scenarios.NAMES) if n in out}


# --------------------------------------------------------------------------- naive rules
def _clean(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def rule_ratio(values: Sequence[float | None]) -> bool:
    """"last value > 1.5 x first value" (first = the first positive reading)."""
    v = [x for x in _clean(values) if x > 0]
    return len(v) >= 2 and v[-1] > 1.5 * v[0]


def rule_stormlog(values: Sequence[float | None]) -> bool:
    """Stormlog's published leak rule: average growth > 0, > 70% of consecutive samples growing,
    total growth > 100 MiB."""
    v = _clean(values)
    if len(v) < 2:
        return False
    diffs = [b - a for a, b in zip(v, v[1:], strict=False)]
    growing = sum(1 for d in diffs if d > 0) / len(diffs)
    return sum(diffs) / len(diffs) > 0 and growing > 0.7 and v[-1] - v[0] > 100 * MiB


NAIVE_RULES = {"ratio_1.5x": rule_ratio, "stormlog": rule_stormlog}


def naive_verdicts(raw: dict[str, Any], rule_name: str) -> list[list[str]]:
    """Per epoch end: the metrics on which ``rule`` fires on everything sampled so far."""
    rule = NAIVE_RULES[rule_name]
    steps = raw["steps"]
    per_epoch: list[list[str]] = []
    for meta in raw["epoch_meta"]:
        n = sum(1 for s in steps if s <= meta["end_step"])
        per_epoch.append([k for k in RULE_KEYS if k in raw["series"]
                          and rule(raw["series"][k][:n])])
    return per_epoch


# --------------------------------------------------------------------------- scoring
def leak_findings(raw: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Per epoch, the leak verdicts of every check in it (its end and the checks inside it)."""
    per_epoch = raw.get("findings", [])
    if "all_findings" not in raw:
        return [[f for f in fs if f.get("kind") in LEAK_KINDS] for fs in per_epoch]
    out: list[list[dict[str, Any]]] = [[] for _ in per_epoch]
    for f in raw["all_findings"]:
        e = f.get("epoch")
        if f.get("kind") in LEAK_KINDS and e is not None and 0 <= e < len(out) \
                and (f.get("stage") or "train") == "train":
            out[e].append(f)
    return out


def end_beliefs(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The training session's current beliefs after the run's last check: one finding per
    belief, its latest state (findings saved without beliefs count one per kind and metric)."""
    from memwatch.analysis.beliefs import current

    train = [f for f in _every(raw) if (f.get("stage") or "train") == "train"]
    return current(train)


def _every(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Every check's findings, in order (epoch ends only for results saved before checks)."""
    if "all_findings" in raw:
        return list(raw["all_findings"])
    return [f for fs in raw.get("findings", []) for f in fs]


def end_state(raw: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What the run believes at its end: the metrics with a leak believed now, and whether one
    on ``prefix`` was believed once and withdrawn (stopped, bounded)."""
    from memwatch.analysis.beliefs import history, state_of

    now = end_beliefs(raw)
    leaking = sorted({f["metric"] for f in now
                      if f.get("kind") in LEAK_KINDS and state_of(f) == "leak"})
    withdrawn = [f for f in now if f["metric"].startswith(prefix) and state_of(f) != "leak"
                 and f.get("belief") and any(c["state"] == "leak" for c in
                                             history(_every(raw), f["belief"]))]
    return {"leaking": leaking, "withdrawn": bool(withdrawn),
            "states": sorted({f"{state_of(f)}:{f['metric']}" for f in now})}


def first_check(raw: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    """The check (index, step, epoch) of the first leak verdict on ``prefix``, if any."""
    for f in raw.get("all_findings", []):
        if f.get("kind") in LEAK_KINDS and f["metric"].startswith(prefix):
            return {"check": f.get("check"), "step": f.get("step"), "epoch": f.get("epoch")}
    return None


def score_scenario(sc: Scenario, raw: dict[str, Any]) -> dict[str, Any]:
    """One row: what each detector said about one scenario, and whether that was right."""
    row: dict[str, Any] = {"name": sc.name, "is_leak": sc.is_leak,
                           "leak_start_epoch": sc.leak_start_epoch,
                           "expected_metric": sc.expected_metric,
                           "expected_culprit": sc.expected_culprit,
                           "expected_kind": sc.expected_kind, "wall_s": raw.get("wall_s")}
    if "error" in raw:
        row["error"] = raw["error"]
        return row
    row["disabled"] = raw.get("disabled", {})
    row["analyzer"] = raw.get("analyzer")
    row["end_epoch_s"] = raw.get("end_epoch_s", [])
    row["train_s"] = sum(m["seconds"] for m in raw["epoch_meta"])
    row["kinds_seen"] = sorted({f"{f['kind']}:{f['metric']}"
                                for fs in raw["findings"] for f in fs})
    prefix = sc.expected_metric + "."
    # Issue 3: "every leak found by the end of the second epoch after it starts": a leak that
    # starts in epoch k must be reported by the end of epoch k + 2. The stricter k + 1 is
    # reported beside it ("next epoch").
    deadline = None if sc.leak_start_epoch is None else sc.leak_start_epoch + DEADLINE_EPOCHS

    # Per detector: the metrics it called leaking at each epoch end.
    verdicts: dict[str, list[list[str]]] = {
        "memwatch": [[f["metric"] for f in fs] for fs in leak_findings(raw)],
    }
    for rule in NAIVE_RULES:
        verdicts[rule] = naive_verdicts(raw, rule)

    for det, per_epoch in verdicts.items():
        any_epochs = [e for e, ms in enumerate(per_epoch) if ms]
        hit_epochs = [e for e, ms in enumerate(per_epoch) if any(m.startswith(prefix) for m in ms)]
        d: dict[str, Any] = {"verdict_epochs": any_epochs,
                             "metrics": sorted({m for ms in per_epoch for m in ms})}
        if sc.is_leak:
            assert deadline is not None and sc.leak_start_epoch is not None
            # A verdict before the leak starts is a guess: flagged as early, and not a detection.
            in_window = [e for e in hit_epochs if e >= sc.leak_start_epoch]
            first = in_window[0] if in_window else None
            d["first_epoch"] = first
            d["detected"] = first is not None and first <= deadline
            d["next_epoch"] = first is not None and first <= sc.leak_start_epoch + 1
            d["epochs_to_detect"] = None if first is None else first - sc.leak_start_epoch + 1
            d["early"] = bool(hit_epochs) and hit_epochs[0] < sc.leak_start_epoch
        else:
            d["false_alarm"] = bool(any_epochs)
        row[det] = d

    # The end of the run: the current beliefs after the last check (the per-check columns above
    # say when a verdict was made; this says whether the run still stands by it).
    end = end_state(raw, prefix)
    if sc.is_leak and sc.expected_kind == "stopped":  # a leak that stops: withdrawn at the end
        end["ok"] = end["withdrawn"] and not any(m.startswith(prefix) for m in end["leaking"])
    elif sc.is_leak:
        end["ok"] = any(m.startswith(prefix) for m in end["leaking"])
    else:
        end["ok"] = not end["leaking"]
    row["memwatch"]["end"] = end

    if not sc.is_leak and row["memwatch"]["false_alarm"]:
        # What a false verdict stood on, kept so that one seen once (a loaded CI machine) can
        # be studied afterwards: the findings' words and evidence, and the raw series.
        row["false_alarm_evidence"] = {
            "findings": [f for fs in leak_findings(raw) for f in fs],
            "series": {k: raw["series"][k] for k in row["memwatch"]["metrics"]
                       if k in raw["series"]},
            "steps": raw["steps"], "epoch_meta": raw["epoch_meta"]}

    if sc.is_leak:
        found = [f for fs in leak_findings(raw) for f in fs if f["metric"].startswith(prefix)]
        culprits = [f.get("culprit") for f in found if f.get("culprit")]
        row["memwatch"]["culprits"] = sorted(set(culprits))[:5]
        row["memwatch"]["first_check"] = first_check(raw, prefix)
        if sc.expected_culprit is not None:
            want = sc.expected_culprit.lower()
            row["memwatch"]["culprit_ok"] = any(want in c.lower() for c in culprits)
        if sc.true_oom_step is not None:
            row["memwatch"]["forecast"] = _forecast(sc, raw)
    rep = _reported.score(sc, row, raw)
    if rep is not None:
        row["reported_score"] = rep
    return row


def _forecast(sc: Scenario, raw: dict[str, Any]) -> dict[str, Any]:
    """Forecast error at the epoch of first detection (the most pessimistic of its forecasts)."""
    assert sc.true_oom_step is not None
    prefix = sc.expected_metric + "."
    for epoch, fs in enumerate(leak_findings(raw)):
        hits = [f for f in fs if f["metric"].startswith(prefix)]
        if not hits:
            continue
        end_step = raw["epoch_meta"][epoch]["end_step"]
        true_remaining = sc.true_oom_step - end_step
        preds = [f["steps_to_oom"] for f in hits if f.get("steps_to_oom") is not None]
        if not preds:
            return {"error": None, "reason": "no steps_to_oom", "epoch": epoch,
                    "true_remaining": true_remaining}
        pred = float(min(preds))
        return {"epoch": epoch, "predicted": pred, "true_remaining": true_remaining,
                "error": abs(pred - true_remaining) / true_remaining}
    return {"error": None, "reason": "no leak verdict"}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]
    leaks = [r for r in ok if r["is_leak"]]
    ctrls = [r for r in ok if not r["is_leak"]]
    out: dict[str, Any] = {"scenarios": len(rows), "errors": [r["name"] for r in rows
                                                              if "error" in r],
                           "leaks": len(leaks), "controls": len(ctrls)}
    # What end_epoch() costs (the analyzer, census included), per call.
    ee = [t for r in ok for t in r.get("end_epoch_s", [])]
    out["end_epoch_s_mean"] = sum(ee) / len(ee) if ee else None
    out["end_epoch_s_max"] = max(ee) if ee else None
    for det in DETECTORS:
        detected = [r for r in leaks if r[det]["detected"]]
        etd = [r[det]["epochs_to_detect"] for r in leaks if r[det]["epochs_to_detect"] is not None]
        false = [r["name"] for r in ctrls if r[det]["false_alarm"]]
        d: dict[str, Any] = {
            "detected": len(detected),
            "detection_rate": len(detected) / len(leaks) if leaks else None,
            "detected_next_epoch": sum(1 for r in leaks if r[det].get("next_epoch")),
            "missed": [r["name"] for r in leaks if not r[det]["detected"]],
            "early": [r["name"] for r in leaks if r[det]["early"]],
            "false_alarms": len(false),
            "false_alarm_scenarios": false,
            "mean_epochs_to_detect": sum(etd) / len(etd) if etd else None,
        }
        if det == "memwatch":
            d["end_leaks_believed"] = sum(1 for r in leaks if r["memwatch"]["end"]["ok"])
            d["end_false"] = [r["name"] for r in ctrls if not r["memwatch"]["end"]["ok"]]
            d["end_withdrawn"] = [r["name"] for r in ok if r["memwatch"]["end"]["withdrawn"]]
            with_c = [r for r in leaks if r["expected_culprit"] is not None]
            good = [r for r in with_c if r["memwatch"].get("culprit_ok")]
            d["culprit_accuracy"] = len(good) / len(with_c) if with_c else None
            d["culprit_named"] = len(good)
            d["culprit_expected"] = len(with_c)
            fc = [r["memwatch"]["forecast"] for r in leaks if "forecast" in r["memwatch"]]
            errs = [f["error"] for f in fc if f.get("error") is not None]
            d["forecasts"] = len(fc)
            d["forecasts_made"] = len(errs)
            d["forecast_error_mean"] = sum(errs) / len(errs) if errs else None
            d["forecast_error_max"] = max(errs) if errs else None
            d["forecasts_within_25pct"] = sum(1 for e in errs if e <= 0.25)
        out[det] = d
    return out


# --------------------------------------------------------------------------- printing
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cell(r: dict[str, Any], det: str) -> str:
    d = r[det]
    if r["is_leak"]:
        if d["first_epoch"] is None:
            return "early" if d["early"] else "MISS"
        return (f"e{d['first_epoch']}" + ("" if d["detected"] else " late")
                + ("!" if d["early"] else ""))
    return "FALSE" if d["false_alarm"] else "quiet"


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any], total_s: float) -> None:
    head = f"{'scenario':<28} {'truth':<9} {'memwatch':<9} {'check':<11} {'end':<6} " \
           f"{'culprit':<8} {'fc err':<7} {'ratio':<9} {'stormlog':<9} {'wall':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<28} ERROR: {r['error'].strip().splitlines()[-1][:60]}")
            continue
        truth = f"leak@e{r['leak_start_epoch']}" if r["is_leak"] else "control"
        mw = r["memwatch"]
        cul = "-" if "culprit_ok" not in mw else ("yes" if mw["culprit_ok"] else "no")
        fc = mw.get("forecast", {})
        fce = "-" if not fc else ("n/a" if fc.get("error") is None else _pct(fc["error"]))
        fcheck = mw.get("first_check")
        chk = "-" if not fcheck else f"c{fcheck['check']}@{fcheck['step']}"
        end = mw.get("end") or {}
        endc = ("ok" if end.get("ok") else "NO") + ("*" if end.get("withdrawn") else "")
        print(f"{r['name']:<28} {truth:<9} {_cell(r, 'memwatch'):<9} {chk:<11} {endc:<6} "
              f"{cul:<8} {fce:<7} {_cell(r, 'ratio_1.5x'):<9} {_cell(r, 'stormlog'):<9} "
              f"{r['wall_s']:6.1f}")
    print("check: the first leak verdict's check (0-based, in its session) and step; "
          "eN: first leak verdict in epoch N (0-based; at its end, or at a check inside it); "
          "late: after the deadline "
          f"(start + {DEADLINE_EPOCHS}); !: also a verdict before the leak started; "
          "FALSE: leak verdict on a control; end: what the run believes after its last check "
          "(ok: a leak still believed for a leak, none for a control; *: a leak verdict withdrawn)")
    print()
    print(f"{'':<34} {'memwatch':>10} {'ratio 1.5x':>11} {'stormlog':>10}")

    def line(label: str, fmt: Any) -> None:
        print(f"{label:<34} " + " ".join(f"{fmt(summary[d]):>{w}}"
                                         for d, w in zip(DETECTORS, (10, 11, 10), strict=True)))

    n_leaks, n_ctrl = summary["leaks"], summary["controls"]
    line(f"leaks found by deadline (of {n_leaks})",
         lambda d: f"{d['detected']} ({_pct(d['detection_rate'])})")
    line(f"  of which by start + 1 (of {n_leaks})",
         lambda d: f"{d['detected_next_epoch']} "
                   f"({_pct(d['detected_next_epoch'] / n_leaks if n_leaks else None)})")
    line(f"false leak verdicts (of {n_ctrl})", lambda d: str(d["false_alarms"]))
    line("mean epochs to first detection", lambda d: _num(d["mean_epochs_to_detect"]))
    m = summary["memwatch"]
    print(f"{'at the end: leaks believed':<34} {m['end_leaks_believed']}/{n_leaks}; controls "
          f"with a leak believed: {len(m['end_false'])}/{n_ctrl}; withdrawn: "
          f"{len(m['end_withdrawn'])}")
    print(f"{'culprit named':<34} {m['culprit_named']}/{m['culprit_expected']} "
          f"({_pct(m['culprit_accuracy'])})")
    fmax = "-" if m["forecast_error_max"] is None else _pct(m["forecast_error_max"])
    fmean = "-" if m["forecast_error_mean"] is None else _pct(m["forecast_error_mean"])
    print(f"{'forecast error (mean / max)':<34} {fmean} / {fmax}; within 25%: "
          f"{m['forecasts_within_25pct']}/{m['forecasts']}")
    if summary["end_epoch_s_mean"] is not None:
        print(f"{'end_epoch() time (mean / max)':<34} {summary['end_epoch_s_mean']:.2f} s / "
              f"{summary['end_epoch_s_max']:.2f} s")
    if summary["errors"]:
        print(f"scenarios that failed to run: {', '.join(summary['errors'])}")
    print(f"total wall time: {total_s:.1f} s")


def score(raw: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [score_scenario(scenarios.load(n).SCENARIO, raw[n]) for n in raw]
    summary = summarize(rows)
    summary["reported"] = _reported.summarize(rows)
    return rows, summary


def _meta(quick: bool, jobs: int, total_s: float) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit, "quick": quick, "jobs": jobs, "total_wall_s": total_s,
            **_common.platform_info()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter epochs (what CI runs)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only this scenario (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="scenarios run at once (default 2)")
    ap.add_argument("--out", default=str(RESULTS), help="where the JSON results go")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--no-analyze", action="store_true",
                    help="record the raw series only (memwatch.watch(analyze=False))")
    ap.add_argument("--check-every", type=int, default=None, metavar="N",
                    help="also check every N steps inside epochs (default: epoch ends only)")
    ap.add_argument("--burners", type=int, default=0, metavar="N",
                    help="run N busy-looping processes beside the corpus (default 0)")
    ap.add_argument("--load-study", action="store_true",
                    help="--repeats runs quiet and as many beside --burners (default 2), "
                         "interleaved; compare what each said")
    ap.add_argument("--repeats", type=int, default=5, metavar="R",
                    help="runs per condition in --load-study (default 5)")
    ap.add_argument("--split", choices=(*scenarios.SPLITS, "all"), default=None,
                    help="run the reported-bug corpus only: its design part, its held-out part "
                         "(never run by the tests), or both")
    ap.add_argument("--memwatch-src", metavar="DIR", default=None,
                    help="run the scenarios against another checkout's src/ (before/after: "
                         "the scoring, end of run included, stays this checkout's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global CHILD_SRC
    CHILD_SRC = os.path.abspath(args.memwatch_src) if args.memwatch_src else None

    if args.child:
        run_child(args.child, args.epochs, args.steps, args.child_out,
                  analyze=not args.no_analyze, check_every=args.check_every)
        return 0
    if args.list:
        listed = ([scenarios.load(n).SCENARIO for n in scenarios.split_names(args.split)]
                  if args.split else scenarios.all_scenarios())
        for sc in listed:
            truth = f"leak from epoch {sc.leak_start_epoch}" if sc.is_leak else "control"
            print(f"{sc.name:<28} {truth:<20} {sc.description}")
        return 0
    for n in args.only or []:
        if n not in scenarios.NAMES and n not in scenarios.HELDOUT:
            ap.error(f"unknown scenario {n!r}; see --list")
    args.only = selected(args.only, args.split)
    if args.only == []:
        ap.error(f"none of --only is in the {args.split} part; see --list --split {args.split}")

    if args.burners < 0 or args.repeats < 1:
        ap.error("--burners must be >= 0 and --repeats >= 1")
    if args.load_study:
        return load_study(args)

    t0 = time.perf_counter()
    with _load.burners(args.burners):
        raw = run_corpus(args.only, quick=args.quick, jobs=args.jobs, progress=True,
                         analyze=not args.no_analyze, check_every=args.check_every)
    total = time.perf_counter() - t0
    rows, summary = score(raw)
    print_table(rows, summary, total)
    _reported.print_table(rows, summary["reported"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": {**_meta(args.quick, args.jobs, total),
                                        "burners": args.burners, "split": args.split,
                                        "check_every": args.check_every}, "summary": summary,
                               "rows": rows}, indent=1, default=_jsonable))
    os.replace(tmp, out)
    print(f"results written to {out}")
    return 0


def selected(only: Sequence[str] | None, split: str | None) -> list[str] | None:
    """The scenarios to run: ``--only`` ones, within ``--split``'s part when both are given;
    None for the whole design corpus."""
    if split is None:
        return list(only) if only else None
    names = list(scenarios.split_names(split))
    return [n for n in names if n in only] if only else names


def load_study(args: argparse.Namespace) -> int:
    """The corpus ``args.repeats`` times quiet and as many beside the burners, interleaved."""
    n_burners = args.burners or 2
    runs: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for i in range(args.repeats):
        for condition, n in (("quiet", 0), ("burners", n_burners)):
            print(f"run {i + 1}/{args.repeats}, {condition}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            with _load.burners(n):
                raw = run_corpus(args.only, quick=args.quick, jobs=args.jobs,
                                 check_every=args.check_every)
                load = _common.load_avg_1min()
            rows, summary = score(raw)
            runs.append({"condition": condition, "burners": n, "rows": rows,
                         "summary": summary, "wall_s": time.perf_counter() - t0,
                         "load_avg_1min": load})
    total = time.perf_counter() - t_all
    cmp = _load.compare(runs)
    _load.print_comparison(cmp, n_burners)
    print(f"total wall time: {total:.1f} s")
    out = Path(args.out) if args.out != str(RESULTS) else LOAD_RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": {**_meta(args.quick, args.jobs, total),
                                        "burners": n_burners, "repeats": args.repeats,
                                        "split": args.split, "check_every": args.check_every},
                               "comparison": cmp, "runs": runs}, indent=1, default=_jsonable))
    os.replace(tmp, out)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
