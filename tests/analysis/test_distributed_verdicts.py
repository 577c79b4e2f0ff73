"""Rank 0's cross-rank verdicts from the per-rank summaries (the payloads real ranks send: see
integrations/distributed for the multi-process suites), and the per-rank series for loggers."""

from __future__ import annotations

from typing import Any

import pytest

from memwatch.analysis.rules.ranks import cross_rank_findings
from memwatch.core.findings import KINDS
from memwatch.core.metrics import rank_log_metrics, rank_metrics

GIB = float(1 << 30)


def summary(rank: int, peak: float, floor: float | None = None, limit: float = 80 * GIB,
            findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"rank": rank, "local_rank": rank % 8, "host": f"n{rank // 8}", "epoch": 3,
            "step": 400, "time": 0.0, "floor": {"device.peak": floor or peak / 2},
            "peak": {"device.peak": peak}, "limits": {"device.peak": limit},
            "findings": findings or []}


def near(sev: str = "warning") -> dict[str, Any]:
    return {"kind": "near_oom", "metric": "device.peak", "severity": sev, "bytes_per_step": None,
            "steps_to_oom": None, "culprit": ""}


def leak(rate: float, steps: float | None, culprit: str = "") -> dict[str, Any]:
    return {"kind": "leak", "metric": "device.allocated", "severity": "warning",
            "bytes_per_step": rate, "steps_to_oom": steps, "culprit": culprit}


def by_kind(fs: list[Any], kind: str) -> list[Any]:
    assert kind in KINDS
    return [f for f in fs if f.kind == kind]


def test_balanced_quiet_ranks_give_no_finding() -> None:
    fs = cross_rank_findings([summary(r, 40 * GIB) for r in range(8)], [], 60)
    assert fs == []


def test_near_oom_names_the_ranks_closest_to_their_limit() -> None:
    ss = [summary(r, 50 * GIB) for r in range(8)]
    ss[5] = summary(5, 77 * GIB, findings=[near()])
    ss[2] = summary(2, 79 * GIB, findings=[near("critical")])
    fs = cross_rank_findings(ss, [], 60)
    (f,) = by_kind(fs, "rank_near_oom")
    assert f.rank == 2 and f.severity == "critical"
    assert f.evidence["ranks"] == [2, 5]  # closest first
    assert f.evidence["others_max_share"] == pytest.approx(50 / 80)
    assert f.message.startswith("device.peak is near its limit on rank(s) 2, 5 of 8: rank 2 at "
                                "99%, rank 5 at 96% of 80.0 GiB. The job's first OOM will most "
                                "likely be on rank 2; the other ranks peak at 62% at most.")
    # the imbalance (79 vs 50 GiB) is reported too, naming the same rank
    (imb,) = by_kind(fs, "rank_imbalance")
    assert imb.rank == 2 and imb.evidence["imbalance"] == pytest.approx(79 / 50)


def test_leak_on_some_ranks_names_them_and_the_first_to_run_out() -> None:
    ss = [summary(r, 40 * GIB) for r in range(4)]
    ss[1]["findings"] = [leak(1 << 20, 9000, "Trainer.cache (dict) +1 MiB/step")]
    ss[3]["findings"] = [leak(2 << 20, 4000, "kept (list)")]
    (f,) = by_kind(cross_rank_findings(ss, [], 60), "rank_leak")
    assert f.evidence["ranks"] == [1, 3] and f.evidence["only_some_ranks"]
    assert "only on rank(s) 1, 3 of 4" in f.message and "Rank 3 runs out first" in f.message
    assert f.rank == 3 and f.culprit == "rank 3: kept (list)"


def test_missing_ranks_are_reported() -> None:
    ss: list[dict[str, Any] | None] = [summary(0, 40 * GIB), None, summary(2, 40 * GIB)]
    (f,) = by_kind(cross_rank_findings(ss, [1], 5), "rank_unresponsive")
    assert f.evidence["ranks"] == [1] and "within 5 s" in f.message


def test_rank_series_for_loggers() -> None:
    ss = [summary(0, 40 * GIB, floor=10 * GIB), summary(1, 60 * GIB, floor=20 * GIB)]
    m = rank_metrics(ss)
    assert m["rank1/device.peak.peak"] == 60 * GIB and m["rank0/device.peak.floor"] == 10 * GIB
    assert m["ranks/device.peak.imbalance"] == pytest.approx(1.5)
    keys = rank_log_metrics(ss)
    assert keys["memwatch/rank1/device.peak.peak_gib"] == pytest.approx(60.0)
    assert keys["memwatch/ranks/device.peak.imbalance"] == pytest.approx(1.5)
