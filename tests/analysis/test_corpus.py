"""The detection corpus (``benchmarks/scenarios/``) end to end, scored against issue 3's targets.

The corpus runs twice per test session (``--quick`` sizes, 2 scenarios at a time, each in its
own process), and two groups of tests read the results:

* **corpus sanity**, on a run with ``analyze=False`` (no analyzer, so no tensor census moving the
  heap at epoch ends): each planted leak really shows in the raw per-step series by about the
  planted amount, and each control really stops growing. This proves the corpus itself is right,
  whatever the analyzer says.
* **targets** (issue 3), on a run with the analyzer: every leak found by the end of the second
  epoch after it starts, no leak verdict on any control, the culprit named where the main process
  can see the holder, and the forecast to OOM within 25% at the epoch of first detection.

Only the design corpus runs here (``scenarios.NAMES``). The held-out part of the reported corpus
(``scenarios.HELDOUT``, issue 23) is never run or imported by the tests: the rules are designed
on the design part, and the held-out part is scored only by ``bench_detection.py --split
heldout``, so that it stays a test of bugs the rules were not tuned on.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import scenarios  # noqa: E402

MiB = 1 << 20
ALL = [scenarios.load(n).SCENARIO for n in scenarios.NAMES]
LEAKS = [s for s in ALL if s.is_leak]
CONTROLS = [s for s in ALL if not s.is_leak]
#: The raw-series sanity run covers issue 3's corpus and the design part's reproductions added in
#: issues 23, 40 and 41 (not their twins); the reproductions of issue 16, all twins and the
#: synthetic Python leaks had theirs when written (measured figures in
#: benchmarks/scenarios/reported/README.md) and run here under the analyzer only, which keeps this
#: module's two corpus runs within a few minutes.
ISSUE23_SANITY = ("rep_accelerator_reuse", "rep_eval_outputs_kept", "rep_gradcam_hooks",
                  "rep_rnn_hidden_graph", "rep_sampler_index_list", "rep_val_outputs_stored")
ISSUE40_41_SANITY = ("rep_numpy_view_bases", "rep_patch_pool_fills", "rep_ring_buffer_prealloc",
                     "rep_train_outputs_uncleared", "rep_val_outputs_uncleared",
                     "rep_wsi_cached_property")
SANITY = [s for s in ALL if not s.name.startswith(("rep_", "fix_", "syn_"))
          or s.name in ISSUE23_SANITY + ISSUE40_41_SANITY]
SANITY_LEAKS = [s for s in SANITY if s.is_leak]
SANITY_CONTROLS = [s for s in SANITY if not s.is_leak]
REPORTED_NON_LEAKS = [s for s in ALL if s.reported and not s.is_leak]
#: The metric whose raw series each kind of scenario is checked on.
SANITY_KEY = {"host": "host.rss", "workers": "workers.uss", "device": "device.allocated"}
#: How much a control may still move between the ends of its last two epochs (its last quarter).
#: Host: where glibc places each epoch's allocations moves a control's RSS by up to ~3 MiB from
#: one epoch to the next, either way (measured on ctrl_epoch_accumulation and
#: ctrl_late_optimizer_state, 3 runs each), so this check is coarse: it would not see a leak
#: under ~30 KiB per step. The leak checks above cover the fine side.
CONTROL_TOLERANCE = {"host.rss": 5.0 * MiB, "workers.uss": 4.0 * MiB,
                     "device.allocated": 48.0 * MiB}


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_detection", REPO / "benchmarks" / "bench_detection.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _load_bench()

# The analyzer's corpus run (65 fresh interpreters, most importing torch) and the raw-series run
# (39) take about 5 minutes together on a lightly loaded 2-core machine (2026-11-27: the whole
# module 8 min at load average 2-5; 5 min before issue 23 added 12 design scenarios); the first
# test that needs a run pays for it, so it gets far more than the default: a machine loaded
# three times over must not turn it into a timeout. The tests that read a run are marked
# ``corpus``: `make test-corpus` runs them, `make test` (and a bare `pytest`) the rest of this
# module (the scoring and the corpus's declarations, seconds).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def corpus() -> dict[str, dict[str, Any]]:
    """Raw series of the whole corpus (quick sizes) watched without the analyzer, by name."""
    return bench.run_corpus(  # type: ignore[no-any-return]
        [s.name for s in SANITY], quick=True, jobs=2, analyze=False)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    """Scored rows of the whole corpus (quick sizes) watched with the analyzer, by name."""
    scored, _ = bench.score(bench.run_corpus(quick=True, jobs=2))
    return {r["name"]: r for r in scored}


def _false_findings(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The leak findings of a false verdict on a control (kept by ``score_scenario``)."""
    return list(row.get("false_alarm_evidence", {}).get("findings", []))


def _raw(corpus: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    raw = corpus[name]
    assert "error" not in raw, f"{name} failed to run: {raw['error']}"
    return raw


def _epoch_values(raw: dict[str, Any], key: str, epoch: int,
                  part: tuple[float, float] = (0.0, 1.0)) -> list[float]:
    """The samples of ``key`` in ``epoch`` (optionally a fraction of it: (0.75, 1.0) = last
    quarter)."""
    meta = raw["epoch_meta"][epoch]
    lo = meta["start_step"] + int(part[0] * meta["n_steps"])
    hi = meta["start_step"] + int(part[1] * meta["n_steps"])
    vals = [v for s, v in zip(raw["steps"], raw["series"][key], strict=True)
            if lo <= s < hi and v is not None]
    assert vals, f"no {key} samples in epoch {epoch} {part}"
    return vals


def _floor(raw: dict[str, Any], key: str, epoch: int) -> float:
    return min(_epoch_values(raw, key, epoch))


# --------------------------------------------------------------------------- scoring (no runs)
def test_naive_rules() -> None:
    flat, leak = [100.0 * MiB] * 50, [100.0 * MiB + i * 4 * MiB for i in range(50)]
    assert not bench.rule_ratio(flat) and not bench.rule_stormlog(flat)
    assert bench.rule_ratio(leak) and bench.rule_stormlog(leak)  # +196 MiB, every step growing
    # Half the steps going down (noise) defeats Stormlog's 70% rule whatever the total growth.
    noisy = [v + (8 * MiB if i % 2 else 0.0) for i, v in enumerate(leak)]
    assert not bench.rule_stormlog(noisy) and bench.rule_ratio(noisy)
    # Small total growth (< 100 MiB) is not a Stormlog leak even if every step grows.
    assert not bench.rule_stormlog([100.0 * MiB + i * MiB for i in range(50)])
    # The ratio rule's "first" is the first positive reading (workers not yet sampled: 0).
    assert not bench.rule_ratio([0.0, None, 10.0 * MiB, 11.0 * MiB])


def _fake_raw(findings: list[list[dict[str, Any]]], steps: int = 10) -> dict[str, Any]:
    n = len(findings)
    return {
        "findings": findings,
        "epoch_meta": [{"epoch": e, "start_step": e * steps + 1, "end_step": (e + 1) * steps,
                        "n_steps": steps, "seconds": 1.0} for e in range(n)],
        "steps": list(range(1, n * steps + 1)),
        "series": {"host.rss": [100.0 * MiB] * (n * steps)},
        "disabled": {}, "analyzer": "Analyzer", "end_epoch_s": [0.1] * n, "wall_s": 1.0,
    }


def _finding(kind: str, metric: str, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "metric": metric, "severity": "warning", **kw}


def test_scoring_of_a_leak_and_a_control() -> None:
    leak = scenarios.load("leak_from_epoch2").SCENARIO  # starts in epoch 1: deadline epoch 3
    late = _fake_raw([[], [], [], [],
                      [_finding("leak", "host.rss", culprit="x.py: hard_examples")]])
    row = bench.score_scenario(leak, late)
    assert row["memwatch"]["first_epoch"] == 4 and not row["memwatch"]["detected"]
    assert row["memwatch"]["epochs_to_detect"] == 4 and row["memwatch"]["culprit_ok"]
    on_time = _fake_raw([[], [], [], [_finding("leak", "host.rss")]])
    row = bench.score_scenario(leak, on_time)
    assert row["memwatch"]["detected"] and not row["memwatch"]["next_epoch"]
    wrong_metric = _fake_raw([[], [_finding("leak", "workers.uss")], [], []])
    assert not bench.score_scenario(leak, wrong_metric)["memwatch"]["detected"]
    early = _fake_raw([[_finding("leak", "host.rss")], [_finding("leak", "host.uss")], [], []])
    row = bench.score_scenario(leak, early)
    assert row["memwatch"]["early"] and row["memwatch"]["detected"]
    ctrl = scenarios.load("ctrl_clean").SCENARIO
    quiet = _fake_raw([[_finding("plateau", "host.rss")], [_finding("step_change", "host.rss")]])
    assert not bench.score_scenario(ctrl, quiet)["memwatch"]["false_alarm"]
    loud = _fake_raw([[], [_finding("worker_growth", "workers.uss")]])
    assert bench.score_scenario(ctrl, loud)["memwatch"]["false_alarm"]


def test_forecast_error_is_measured_at_first_detection() -> None:
    sc = scenarios.load("dev_linear_leak").SCENARIO
    assert sc.true_oom_step == 4608
    # Detected at the end of epoch 1 (step 400): 4208 steps truly remain; predicted 3787.2.
    raw = _fake_raw([[], [_finding("leak", "device.allocated", steps_to_oom=3787.2),
                          _finding("leak", "device.reserved", steps_to_oom=5000.0)],
                     [_finding("leak", "device.allocated", steps_to_oom=1.0)]], steps=200)
    fc = bench.score_scenario(sc, raw)["memwatch"]["forecast"]
    assert fc["epoch"] == 1 and fc["true_remaining"] == 4208
    assert abs(fc["error"] - 0.1) < 1e-9  # the most pessimistic forecast of that epoch
    no_fc = _fake_raw([[], [_finding("leak", "device.allocated")]], steps=200)
    assert bench.score_scenario(sc, no_fc)["memwatch"]["forecast"]["error"] is None


def test_scoring_at_the_end_of_the_run() -> None:
    """Beside the per-check columns, the current beliefs after the last check: a leak still
    believed for a leak; none for a control (a leak verdict withdrawn since counts as none)."""
    leak = scenarios.load("leak_from_epoch2").SCENARIO
    said = _finding("leak", "host.rss", belief="train/host/1")
    row = bench.score_scenario(leak, _fake_raw([[], [said], [said]]))
    assert row["memwatch"]["end"]["ok"] and not row["memwatch"]["end"]["withdrawn"]
    stopped = _finding("plateau", "host.rss", belief="train/host/1",
                       evidence={"belief_state": "stopped"})
    row = bench.score_scenario(leak, _fake_raw([[], [said], [stopped]]))
    assert not row["memwatch"]["end"]["ok"] and row["memwatch"]["end"]["withdrawn"]
    assert row["memwatch"]["detected"]  # the per-check column still says when it was found
    ctrl = scenarios.load("ctrl_bounded_deque").SCENARIO
    bounded = _finding("plateau", "host.rss", belief="train/host/1",
                       evidence={"belief_state": "bounded", "pattern": "bounded"})
    row = bench.score_scenario(ctrl, _fake_raw([[said], [bounded]]))
    assert row["memwatch"]["false_alarm"] and row["memwatch"]["end"]["ok"]
    assert not bench.score_scenario(ctrl, _fake_raw([[], [said]]))["memwatch"]["end"]["ok"]
    summary = bench.summarize([bench.score_scenario(leak, _fake_raw([[], [said], [said]])),
                               bench.score_scenario(ctrl, _fake_raw([[said], [bounded]]))])
    assert summary["memwatch"]["end_leaks_believed"] == 1
    assert summary["memwatch"]["end_false"] == [] and summary["memwatch"]["end_withdrawn"] == \
        ["ctrl_bounded_deque"]


def test_reported_scoring_per_split() -> None:
    """Issue 23's reported scores: found by the 2nd check (start + 1) beside the deadline; a
    bounded non-leak is right with a plateau or a step; ``none`` is right when quiet."""
    leak = scenarios.load("rep_gradcam_hooks").SCENARIO  # starts in epoch 1
    late = bench.score_scenario(leak, _fake_raw(  # epoch 3: the third check since it started
        [[], [], [], [_finding("leak", "host.rss", culprit="m.fc2._forward_hooks[3] (list)")]]))
    s = late["reported_score"]
    assert s["split"] == "design" and s["found"] and not s["found_2nd"] and s["holder"]
    early = bench.score_scenario(leak, _fake_raw([[], [_finding("leak", "host.rss")], []]))
    assert early["reported_score"]["found_2nd"] and early["reported_score"]["holder"] is False
    bounded = scenarios.load("rep_eval_outputs_kept").SCENARIO
    for kind, right in (("plateau", True), ("step_change", True), ("accumulation", False)):
        row = bench.score_scenario(bounded, _fake_raw([[], [_finding(kind, "host.rss")]]))
        assert row["reported_score"]["kind"] is right, kind
    loud = bench.score_scenario(bounded, _fake_raw([[_finding("plateau", "host.rss")],
                                                   [_finding("leak", "host.rss")]]))
    assert not loud["reported_score"]["kind"] and not loud["reported_score"]["quiet"]
    none = scenarios.load("rep_sampler_index_list").SCENARIO
    assert bench.score_scenario(none, _fake_raw([[], []]))["reported_score"]["kind"]
    rows = [bench.score_scenario(leak, _fake_raw([[], [_finding("leak", "host.rss")], []])),
            bench.score_scenario(none, _fake_raw([[], [_finding("leak", "host.uss")]]))]
    summary = bench._reported.summarize(rows)
    assert set(summary) == {"design"}
    assert summary["design"]["found_2nd"] == 1 and summary["design"]["right_kind"] == 0


# --------------------------------------------------------------------------- corpus sanity
def test_corpus_declares_enough_patterns() -> None:
    real_leaks = [s for s in LEAKS if s.device_total is None]
    real_ctrls = [s for s in CONTROLS if s.device_total is None]
    assert len(real_leaks) >= 10 and len(real_ctrls) >= 10
    assert any(s.true_oom_step for s in LEAKS)
    assert {s.expected_metric for s in ALL} == {"host", "workers", "device"}
    for s in ALL:
        assert s.description and s.name in scenarios.NAMES


def test_heldout_part_stays_out_of_the_tests() -> None:
    """The held-out reproductions are listed apart, named apart, and never in the design corpus
    (what this module runs); the split is checked by the scenarios' own validation."""
    assert not set(scenarios.NAMES) & set(scenarios.HELDOUT)
    assert all(n.startswith(("ho_rep_", "ho_fix_")) for n in scenarios.HELDOUT)
    assert all(s.split == "design" for s in ALL)
    assert {s.name for s in ALL} == set(scenarios.NAMES)
    assert len([n for n in scenarios.HELDOUT if n.startswith("ho_rep_")]) >= 6
    with pytest.raises(ValueError, match="held out"):
        scenarios.Scenario(name="ho_leak_x", is_leak=False, leak_start_epoch=None,
                           expected_metric="host", expected_culprit=None, description="x",
                           split="heldout")
    with pytest.raises(ValueError, match="named ho_"):
        scenarios.Scenario(name="rep_x", is_leak=False, leak_start_epoch=None,
                           expected_metric="host", expected_culprit=None, description="x",
                           source="https://example.org/1", reported=True, split="heldout")


def test_growth_fields_are_checked() -> None:
    """Issues 40 and 41's ``growth``, ``stops_at_step`` and ``eval_every`` are validated."""
    base = {"name": "ctrl_x", "is_leak": False, "leak_start_epoch": None,
            "expected_metric": "host", "expected_culprit": None, "description": "x"}
    with pytest.raises(ValueError, match="growth must be"):
        scenarios.Scenario(**base, growth="sawtooth")
    with pytest.raises(ValueError, match="stops_at_step"):
        scenarios.Scenario(**base, growth="stops")
    with pytest.raises(ValueError, match="stops_at_step"):
        scenarios.Scenario(**base, stops_at_step=100)
    with pytest.raises(ValueError, match="eval_every"):
        scenarios.Scenario(**base, growth="eval")
    assert scenarios.Scenario(**base, growth="stops", stops_at_step=100).stops_at_step == 100


@pytest.mark.corpus
def test_every_scenario_runs(corpus: dict[str, dict[str, Any]]) -> None:
    failed = {n: r["error"][-400:] for n, r in corpus.items() if "error" in r}
    assert not failed
    assert set(corpus) == {s.name for s in SANITY}
    for name, raw in corpus.items():
        assert raw["disabled"] == {}, f"{name}: memwatch disabled {raw['disabled']}"
        assert len(raw["epoch_meta"]) == raw["epochs"]
        assert all(fs == [] for fs in raw["findings"]), "analyze=False still gave findings"


@pytest.mark.corpus
def test_every_scenario_runs_under_the_analyzer(rows: dict[str, dict[str, Any]]) -> None:
    assert set(rows) == set(scenarios.NAMES)
    problems = {n: r.get("error") or r["disabled"] for n, r in rows.items()
                if "error" in r or r["disabled"]}
    assert not problems


@pytest.mark.corpus
@pytest.mark.parametrize("sc", SANITY_LEAKS, ids=lambda s: s.name)
def test_planted_leak_shows_in_raw_series(corpus: dict[str, dict[str, Any]],
                                          sc: scenarios.Scenario) -> None:
    """Floors of later epochs sit above the leak's first epoch by about the planted amount.

    Compared from epoch 1 at the earliest: epoch 0's floor is the very first sample, before the
    process's own warm-up (allocator arenas, lazy torch state). The upper bound is loose because
    RSS grows by more than the kept payloads: tensor objects, autograd nodes, and the holes that
    small 64-byte-aligned blocks kept between freed temporaries leave in glibc's heap (measured:
    up to ~1.8x for a 64 KiB view kept per step).
    """
    raw = _raw(corpus, sc.name)
    key = SANITY_KEY[sc.expected_metric]
    assert sc.leak_start_epoch is not None and sc.planted_bytes_per_step is not None
    start, last = max(sc.leak_start_epoch, 1), raw["epochs"] - 1
    floors = [_floor(raw, key, e) for e in range(raw["epochs"])]
    steps_between = sum(raw["epoch_meta"][e]["n_steps"] for e in range(start, last))
    planted = sc.planted_bytes_per_step * steps_between
    grown = floors[last] - floors[start]
    # Workers add their own overhead on top of the payload: every cached sample is a Python
    # object in a dict, and the forked heap keeps turning shared pages private while it grows
    # (measured up to ~3.2x of the payload for leak_worker_cache under load).
    upper = 4.0 if sc.expected_metric == "workers" else 2.5
    assert 0.5 * planted <= grown <= upper * planted, (
        f"{key} floors {[round(f / MiB, 2) for f in floors]} MiB: grew "
        f"{grown / MiB:.2f} MiB from epoch {start} to {last}, planted {planted / MiB:.2f} MiB")
    # ... and no epoch's floor below the previous one once the leak runs (a slow leak may fill
    # free holes of the heap for a while before RSS moves: hence not strictly above).
    for e in range(start + 1, last + 1):
        assert floors[e] >= floors[e - 1], f"{key} floor of epoch {e} went down: {floors}"


@pytest.mark.corpus
@pytest.mark.parametrize("sc", SANITY_CONTROLS, ids=lambda s: s.name)
def test_control_stops_growing(corpus: dict[str, dict[str, Any]],
                               sc: scenarios.Scenario) -> None:
    """The level at the end of the run equals the level at the end of the epoch before."""
    raw = _raw(corpus, sc.name)
    key = SANITY_KEY[sc.expected_metric]
    last = raw["epochs"] - 1
    end = min(_epoch_values(raw, key, last, (0.75, 1.0)))
    before = min(_epoch_values(raw, key, last - 1, (0.75, 1.0)))
    assert end - before <= CONTROL_TOLERANCE[key], (
        f"{key} still grows at the end: {before / MiB:.2f} -> {end / MiB:.2f} MiB")


#: How much a bounded reproduction (``growth="stops"``) must have grown before it stopped, from
#: its first epoch's floor to the end of the run: each fills 15-30 MiB by design (the README's
#: checks), three times the controls' tolerance, so a buffer that stayed empty cannot pass as a
#: bounded one.
BOUNDED_FILL = 3 * CONTROL_TOLERANCE["host.rss"]


@pytest.mark.corpus
@pytest.mark.parametrize("sc", [s for s in SANITY_CONTROLS if s.growth == "stops"],
                         ids=lambda s: s.name)
def test_bounded_reproduction_fills_before_it_stops(corpus: dict[str, dict[str, Any]],
                                                    sc: scenarios.Scenario) -> None:
    """A bounded buffer really filled (test_control_stops_growing checks that it then stopped)."""
    raw = _raw(corpus, sc.name)
    key = SANITY_KEY[sc.expected_metric]
    last = raw["epochs"] - 1
    grown = min(_epoch_values(raw, key, last, (0.75, 1.0))) - _floor(raw, key, 0)
    assert grown >= BOUNDED_FILL, (
        f"{key} grew {grown / MiB:.2f} MiB from the first epoch's floor to the end of the run; "
        f"a buffer filling to step {sc.stops_at_step} should add at least "
        f"{BOUNDED_FILL / MiB:.0f} MiB")


@pytest.mark.corpus
def test_worker_cow_control_really_copies_pages(corpus: dict[str, dict[str, Any]]) -> None:
    """Worker USS rises by tens of MiB in the first epoch (pages copied), then stays."""
    raw = _raw(corpus, "ctrl_worker_cow")
    uss = _epoch_values(raw, "workers.uss", 0)
    assert max(uss) - min(uss) > 20 * MiB, f"workers.uss {min(uss) / MiB:.1f} -> " \
        f"{max(uss) / MiB:.1f} MiB in epoch 0"


@pytest.mark.corpus
def test_worker_leak_is_in_workers_not_host(corpus: dict[str, dict[str, Any]]) -> None:
    raw = _raw(corpus, "leak_worker_cache")
    last = raw["epochs"] - 1
    host_growth = _floor(raw, "host.rss", last) - _floor(raw, "host.rss", 1)
    workers_growth = _floor(raw, "workers.uss", last) - _floor(raw, "workers.uss", 1)
    assert workers_growth > 2 * max(host_growth, 1 * MiB), (host_growth, workers_growth)


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["dev_fragmentation", "dev_fragmentation_scripted"])
def test_fragmentation_controls_grow_reserved_not_allocated(corpus: dict[str, dict[str, Any]],
                                                            name: str) -> None:
    raw = _raw(corpus, name)
    last = raw["epochs"] - 1
    gap = [r - a for r, a in zip(raw["series"]["device.reserved"],
                                 raw["series"]["device.allocated"], strict=True)]
    meta = raw["epoch_meta"]
    i_end0 = raw["steps"].index(meta[0]["end_step"])
    assert gap[-1] - gap[i_end0] > 200 * MiB
    alloc_growth = _floor(raw, "device.allocated", last) - _floor(raw, "device.allocated", 1)
    assert alloc_growth < 16 * MiB


# --------------------------------------------------------------------------- issue 3 targets
#: Issue 23's targets on the design part that the analyzer does not meet yet, as strict xfails:
#: each fails the run the day memwatch meets it, so the marker goes with the fix. (The two
#: written with the corpus, rep_rnn_hidden_graph's holder and rep_eval_outputs_kept's bounded
#: step, are met: the root of a growing autograd chain is found among the tensors Python code
#: refers to, and a rise between checks held flat since is a step_change; the second only in
#: some runs, see below.)
ISSUE23_MISSES: dict[str, pytest.MarkDecorator] = {
    # Not strict: the same code says step_change, allocator_retention or nothing depending on
    # the run (2026-11-27: step_change and allocator_retention once each in two single-scenario
    # runs; nothing, allocator_retention, nothing in three corpus runs; step_change in the
    # previous full test run, allocator_retention in the next). Suspected: whether the census
    # the first check only hints at fits the cost budget, so whether the pair of censuses
    # straddles the first validation's kept outputs. A verdict that changes from run to run
    # is a bug (issue 24's notes); no leak verdict either way
    # (test_no_leak_verdict_on_control).
    "rep_eval_outputs_kept": pytest.mark.xfail(strict=False, reason=(
        "bounded step said as step_change or allocator_retention depending on the run")),
}


def _params(scs: list[scenarios.Scenario],
            marks: dict[str, pytest.MarkDecorator]) -> list[Any]:
    return [pytest.param(s, marks=marks[s.name]) if s.name in marks else s for s in scs]


#: Issues 40 and 41's design reproductions whose targets the analyzer misses at their base
#: (`763b8cf`, three runs of ``bench_detection.py --quick --split all``; reported/README.md).
ISSUE40_41_MISSES: dict[str, pytest.MarkDecorator] = {
    # (rep_wsi_cached_property's holder, a strict xfail at the base, is named since issue 41:
    # each worker answers a census of its own, which counts the attributes set on the
    # Dataset's list of datasets: ``WsiDataset._wsi``.)
    # Not strict: a deque(maxlen=12800) full at step 200 draws no finding, a step_change or a
    # leak verdict naming the full deque (issue 40's first case) depending on the run (7 runs of
    # two versions of the loop: 4 leak verdicts, 2 without a finding, 1 step_change). A verdict
    # that changes from run to run is a bug.
    "rep_patch_pool_fills": pytest.mark.xfail(strict=False, reason=(
        "a bounded deque that fills mid-run: a leak verdict, a step or nothing, by the run")),
}
#: Every design target the analyzer misses today, by scenario.
DESIGN_MISSES = {**ISSUE23_MISSES, **ISSUE40_41_MISSES}


@pytest.mark.corpus
@pytest.mark.parametrize("sc", LEAKS, ids=lambda s: s.name)
def test_leak_found_by_second_epoch(rows: dict[str, dict[str, Any]],
                                    sc: scenarios.Scenario) -> None:
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    mw = r["memwatch"]
    assert mw["detected"], (
        f"no leak verdict on {sc.expected_metric}.* by epoch "
        f"{sc.leak_start_epoch + bench.DEADLINE_EPOCHS} "
        f"(first at {mw['first_epoch']}); findings seen: {r['kinds_seen']}")
    assert not mw["early"], f"leak verdict before the leak started: {mw['verdict_epochs']}"


@pytest.mark.corpus
@pytest.mark.parametrize("sc", _params(CONTROLS, ISSUE40_41_MISSES), ids=lambda s: s.name)
def test_no_leak_verdict_on_control(rows: dict[str, dict[str, Any]],
                                    sc: scenarios.Scenario) -> None:
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    assert not r["memwatch"]["false_alarm"], (
        f"false leak verdict at epochs {r['memwatch']['verdict_epochs']} on "
        f"{r['memwatch']['metrics']}; findings seen: {r['kinds_seen']}; what the verdict "
        f"stood on: {[(f.get('message'), f.get('evidence')) for f in _false_findings(r)]}")


@pytest.mark.corpus
@pytest.mark.parametrize("sc", _params([s for s in LEAKS if s.expected_culprit], DESIGN_MISSES),
                         ids=lambda s: s.name)
def test_culprit_named(rows: dict[str, dict[str, Any]], sc: scenarios.Scenario) -> None:
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    assert r["memwatch"].get("culprit_ok"), (
        f"expected {sc.expected_culprit!r} in the culprit; got {r['memwatch']['culprits']}")


@pytest.mark.corpus
@pytest.mark.parametrize("sc", [s for s in LEAKS if s.true_oom_step], ids=lambda s: s.name)
def test_forecast_error_within_25pct(rows: dict[str, dict[str, Any]],
                                     sc: scenarios.Scenario) -> None:
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    fc = r["memwatch"]["forecast"]
    assert fc.get("error") is not None, f"no forecast: {fc}"
    assert fc["error"] <= 0.25, f"forecast {fc}"


# --------------------------------------------------------------------------- issue 16 targets
_ACCUMULATION_MISS = pytest.mark.xfail(strict=True, reason=(
    "Lightning 15514's step outputs are 64 KiB tensors: glibc keeps the freed chunks, RSS "
    "never drops at the epoch end, so the shape is not accumulation; Lightning 8583's are held "
    "only during each validation, between training steps, where no series sees them (the "
    "essential part, no leak verdict, is test_no_leak_verdict_on_control's)"))


@pytest.mark.corpus
@pytest.mark.parametrize("sc", [pytest.param(s, marks=_ACCUMULATION_MISS)
                                if s.expected_kind == "accumulation" else
                                _params([s], DESIGN_MISSES)[0]
                                for s in REPORTED_NON_LEAKS], ids=lambda s: s.name)
def test_reported_non_leak_said_for_what_it_is(rows: dict[str, dict[str, Any]],
                                               sc: scenarios.Scenario) -> None:
    """A non-leak by its thread's resolution gets the finding of that kind (mapped file pages,
    copy-on-write, accumulation, a bounded plateau or step; nothing for a constant cost), and no
    leak verdict."""
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    assert r["reported_score"]["kind"], (
        f"expected {sc.expected_kind}; said {r['reported_score'].get('said')}; each epoch's "
        f"first, lowest and last MiB: {r['reported_score'].get('kind_evidence')}")


@pytest.mark.corpus
@pytest.mark.parametrize("sc", _params([s for s in LEAKS if s.reported], DESIGN_MISSES),
                         ids=lambda s: s.name)
def test_reported_leak_of_the_right_kind(rows: dict[str, dict[str, Any]],
                                         sc: scenarios.Scenario) -> None:
    """A reported leak is found with its holder and, for workers that multiply, as a growing
    worker count (not per-worker growth)."""
    r = rows[sc.name]
    assert "error" not in r, r.get("error")
    s = r["reported_score"]
    assert s["found"] and s["holder"] and s["kind"], (s, r["memwatch"].get("culprits"),
                                                      r["kinds_seen"])
