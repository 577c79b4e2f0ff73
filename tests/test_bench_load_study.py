"""The load study's words and flips (``benchmarks/bench_load_study.py``), on fabricated rows:
the runs themselves are the benchmark's (minutes), not the suite's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_load_study as study  # noqa: E402
from benchmarks import scenarios  # noqa: E402


def _leak(first: int | None, culprit: bool | None = None) -> dict[str, Any]:
    mw: dict[str, Any] = {"first_epoch": first, "detected": first is not None}
    if culprit is not None:
        mw["culprit_ok"] = culprit
    return {"name": "x", "is_leak": True, "memwatch": mw}


def test_a_verdict_is_one_word_of_when_holder_and_kind() -> None:
    assert study.verdict(_leak(1, culprit=True)) == "e1 h+"
    assert study.verdict(_leak(None, culprit=False)) == "MISS h-"
    assert study.verdict(_leak(2)) == "e2"
    quiet = {"name": "c", "is_leak": False, "memwatch": {"false_alarm": False, "metrics": []},
             "reported_score": {"kind": False}}
    assert study.verdict(quiet) == "quiet k-"
    false = {"name": "c", "is_leak": False,
             "memwatch": {"false_alarm": True, "metrics": ["host.rss"]}}
    assert study.verdict(false) == "FALSE:host.rss"
    assert study.verdict({"name": "c", "error": "boom"}) == "ERROR"


def test_only_scenarios_whose_words_differ_flip() -> None:
    runs = [{"condition": c, "verdicts": {"steady": "e1 h+", "moved": w}}
            for c, w in (("quiet", "e1 h+"), ("loaded", "e1 h-"), ("quiet", "e1 h+"),
                         ("loaded", "e1 h+"))]
    assert study.flips(runs) == {"moved": {"quiet": ["e1 h+", "e1 h+"],
                                           "loaded": ["e1 h-", "e1 h+"]}}


def test_the_whole_corpus_is_both_parts_by_name() -> None:
    whole = study.selected(None, "whole")
    assert whole == list(scenarios.NAMES) + list(scenarios.HELDOUT)
    assert study.selected(["ctrl_clean", "nope"], "whole") == ["ctrl_clean"]
    assert study.selected(["ctrl_clean"], "design") == []  # not a reported scenario


def test_a_trail_says_what_each_check_said() -> None:
    raw = {"findings": [[], [{"rule": "native", "kind": "leak", "metric": "host.rss",
                              "evidence": {"belief_state": "leak"}},
                             {"rule": "workers", "kind": "plateau", "metric": "workers.uss"}],
                        [{"rule": "native", "kind": "allocator_retention", "metric": "host.rss",
                          "evidence": {"belief_state": "withdrawn"}}]]}
    assert study.trail(raw) == [[], ["native:leak:host.rss", "workers:plateau:workers.uss"],
                                ["native:allocator_retention:host.rss=withdrawn"]]
    assert study.trail({}) == [] and study.trail({"findings": [None, ["x"]]}) == [[], []]


def test_a_missed_kind_keeps_each_epochs_shape() -> None:
    from benchmarks import _reported

    mib = 2**20
    raw = {"steps": [1, 2, 3, 4], "epoch_meta": [{"start_step": 1, "end_step": 2},
                                                 {"start_step": 3, "end_step": 4}],
           "series": {"host.rss": [10 * mib, 9 * mib, 12 * mib, None],
                      "workers.uss": [1.0, 1.0, 1.0, 1.0]}}
    assert _reported.epoch_shape(raw, "host.") == {"host.rss": [[10.0, 9.0, 9.0],
                                                                [12.0, 12.0, 12.0]]}
    assert _reported.epoch_shape({}, "host.") == {}
