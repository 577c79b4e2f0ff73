"""Beliefs (issue 40): one per suspected leak, revised at every check — growth that stops is
withdrawn as a plateau that names where it stopped, growth that resumes is a leak again, growth
into a holder with its own bound is judged with that bound, equal stairs held at two boundaries
are a leak at the second, and which ranks leak is judged again at every exchange. From recorded
series and a scripted :class:`RecordedEvidence`; the console's lines from a real warner."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest

from memwatch.analysis import Analyzer, CheckContext
from memwatch.analysis.beliefs import (
    Beliefs,
    current,
    describe,
    flat_checks_needed,
    history,
    state_of,
)
from memwatch.analysis.evidence import (
    Attribution,
    Bound,
    ContainerGrowth,
    Holder,
    HolderSize,
)
from memwatch.analysis.rules.ranks import cross_rank_findings
from memwatch.core.findings import Finding, Origin
from memwatch.runtime.warn import FindingWarner
from memwatch.testing.evidence import RecordedEvidence
from memwatch.timeline import Timeline

MIB = float(1 << 20)
GIB = float(1 << 30)
STEPS = 200


@dataclasses.dataclass
class _Chosen:
    """The candidate an attribution named (its growth in bytes)."""

    bytes: float


def _named(path: str, bound: Bound | None = None, length: int = 100) -> Attribution:
    """A census that names ``path`` as the holder of what grew: 100 items of 1 MiB a check."""
    c = ContainerGrowth(obj_id=1, kind="list" if bound is None else "deque", length=length,
                        len_delta=100, new=False, bytes_delta=100 * MIB, element="tensors")
    return Attribution(explained_bytes=100 * MIB, container=c, chosen=_Chosen(100 * MIB),
                       holder=Holder(path, "attribute", "list" if bound is None else "deque",
                                     length, owner_delta=100, bound=bound, elements="tensors"),
                       census_epochs=[0, 1])


def _run(level: Callable[[int], float], ev: RecordedEvidence, epochs: int,
         closing: Callable[[int], float] | None = None,
         between: Callable[[int, RecordedEvidence], None] | None = None,
         limit: float = 64 * GIB) -> list[list[Finding]]:
    """``epochs`` epochs of host.rss at ``level(step)``; per epoch the findings of its check
    (the closing reading ``closing(epoch)`` when given)."""
    tl, an = Timeline(["host.rss"]), Analyzer(evidence=ev)
    out = []
    for e in range(epochs):
        if between is not None:
            between(e, ev)
        for s in range(STEPS):
            step = e * STEPS + s
            tl.append(step, float(step), [level(step)])
        ctx = CheckContext(origin=Origin(epoch=e, step=(e + 1) * STEPS, check=e),
                           limits={"host.rss": limit}, census="always",
                           closing={} if closing is None else {"host.rss": closing(e)})
        out.append(an.check(tl.end_epoch(), ctx))
    return out


def _leaks(found: list[list[Finding]]) -> list[Finding]:
    return [f for fs in found for f in fs if f.kind == "leak"]


def test_a_leak_that_stops_is_withdrawn_as_a_plateau_that_names_where() -> None:
    # 1 MiB a step for three epochs, then flat; the holder stops at 300 items.
    ev = RecordedEvidence(attribution=_named("Model.kept"))

    def sizes(e: int, ev: RecordedEvidence) -> None:
        ev.sizes["Model.kept"] = HolderSize(min(e, 3) * 100)

    found = _run(lambda s: GIB + min(s, 3 * STEPS) * MIB, ev, 7, between=sizes)
    fs = [f for fs in found for f in fs]
    leaks = _leaks(found)
    assert leaks and leaks[0].epoch == 1 and leaks[0].belief == "train/host/1"
    stopped = [f for f in fs if state_of(f) == "stopped"]
    assert len(stopped) == 1, [(f.epoch, f.kind, state_of(f)) for f in fs]
    f = stopped[0]
    # Epoch 3's floor still holds epoch 2's growth; epochs 4 and 5 are flat: two checks (the
    # leak's rate would have added far more than twice the threshold in one; never fewer than
    # two), the holder's size flat.
    assert f.epoch == 5 and f.kind == "plateau" and f.rule == "belief"
    assert f.belief == leaks[0].belief and f.evidence["withdraws"]["epoch"] == 1
    assert "`Model.kept` stopped growing at 300 items" in f.message
    assert "The leak verdict of epoch 1 (check 1, step 400) is withdrawn" in f.message
    assert f.evidence["belief_change"] == f.message
    now = current(fs)
    assert [state_of(x) for x in now if x.belief == f.belief] == ["stopped"]
    assert describe(history(fs, f.belief)) == \
        "leak at epoch 1 (step 400) → stopped at epoch 5 (step 1200)"


def test_growth_that_resumes_is_a_leak_again() -> None:
    ev = RecordedEvidence(attribution=_named("Model.kept"))

    def level(s: int) -> float:  # grows 3 epochs, flat 3, grows again
        return GIB + (min(s, 3 * STEPS) + max(s - 6 * STEPS, 0)) * MIB

    fs = [f for fs in _run(level, ev, 10) for f in fs]
    states = [c["state"] for c in history(fs, "train/host/1")]
    assert states == ["leak", "stopped", "leak"], states
    resumed = [f for f in fs if f.kind == "leak" and f.evidence.get("belief_was") == "stopped"]
    assert resumed and "grows again" in resumed[0].evidence["belief_change"]


def test_a_holder_with_its_own_bound_is_judged_with_it() -> None:
    # A deque(maxlen=400) of 1 MiB items filling at one a step: 200 of 400 at the verdict.
    ev = RecordedEvidence(attribution=_named("Model.replay", Bound("deque", 400, 200), 200))
    found = _run(lambda s: GIB + min(s, 2 * STEPS) * MIB, ev, 2)
    (f,) = [f for f in found[1] if f.kind in ("leak", "plateau")]
    assert f.kind == "plateau" and f.evidence["pattern"] == "bounded" and f.rule == "bounded"
    assert state_of(f) == "bounded" and f.severity == "info"
    assert "bounded (deque(maxlen=400)): 200 of 400 items now" in f.message
    assert "Not a leak" in f.message and not any("bound it" in s for s in f.suggestions)


def test_a_bound_that_will_not_fit_is_a_leak_and_never_asks_for_a_bound() -> None:
    ev = RecordedEvidence(attribution=_named("Model.replay", Bound("deque", 100_000, 200), 200))
    found = _run(lambda s: GIB + s * MIB, ev, 2, limit=8 * GIB)
    (f,) = _leaks(found)
    assert f.suggestions and "already bounded (`deque(maxlen=100000)`" in f.suggestions[0]
    assert not any("bound it" in s for s in f.suggestions)


def test_equal_stairs_held_are_a_leak_at_the_second() -> None:
    # Flat epochs; every check's closing reading stands 8 MiB above the epoch: what each
    # evaluation keeps. Stair 1 at the first check, stair 2 at the second: confirmed there.
    ev = RecordedEvidence(attribution=_named("Model.outputs"))
    found = _run(lambda s: GIB + (s // STEPS) * 8 * MIB, ev, 3,
                 closing=lambda e: GIB + (e + 1) * 8 * MIB)
    leaks = _leaks(found)
    assert leaks and leaks[0].epoch == 1 and leaks[0].evidence["pattern"] == "stairs"
    assert leaks[0].bytes_per_step == pytest.approx(8 * MIB / STEPS, rel=0.01)
    assert "rises by 8.0 MiB at every epoch end and keeps it" in leaks[0].message


def test_outputs_kept_until_the_next_evaluation_make_no_second_stair() -> None:
    # Each evaluation keeps 8 MiB and frees the previous one's: one stair, held, then none.
    ev = RecordedEvidence(attribution=_named("Model.outputs"))
    found = _run(lambda s: GIB + (8 * MIB if s >= STEPS else 0.0), ev, 4,
                 closing=lambda e: GIB + 8 * MIB)
    assert not _leaks(found)


def test_the_stairs_tolerance_comes_from_the_measured_noise() -> None:
    from memwatch.analysis.stats.shapes import EpochStats
    from memwatch.analysis.stats.trend import Trend

    def unit(lo: float, closing: float, noise: float) -> EpochStats:
        t = Trend(200, 0, 0, 1, 0, 0, 0, lo, 0, noise)
        return EpochStats(0, "host.rss", 200, 200, 0.01, lo, lo, lo, lo, lo, 0.0, t, noise,
                          max(256 * 1024, 4 * noise), "flat", closing=closing)

    cfg = Analyzer().config
    s1, noise = 8 * MIB, 0.25 * MIB  # tolerance: 4 x sqrt(4 x 0.25²) MiB = 2 MiB
    a = unit(GIB, GIB + s1, noise)
    assert cfg.stairs([a, unit(GIB + s1, GIB + s1 + 9.9 * MIB, noise)]) is not None
    assert cfg.stairs([a, unit(GIB + s1, GIB + s1 + 10.1 * MIB, noise)]) is None
    quiet = unit(GIB, GIB + s1, 0.0)  # no noise: equal within the threshold (256 KiB)
    assert cfg.stairs([quiet, unit(GIB + s1, GIB + s1 + s1 + 200 * 1024, 0.0)])
    assert cfg.stairs([quiet, unit(GIB + s1, GIB + s1 + s1 + 300 * 1024, 0.0)]) is None


def test_a_stair_leaks_rate_is_averaged_over_every_period_since_it_began() -> None:
    """Recorded (an HF evaluation keeping 8 MiB of logits, under load): RSS closed each period
    8-9 MiB higher but once 16.7 (the allocator taking a new region); the last three periods
    said 8.0 MiB a period where the run's RSS rose 10.4, and the forecast missed by 34%. The
    periods before the leak began (flat closings) are not part of its rate."""
    from memwatch.analysis.rules.leak.rule import _period
    from memwatch.analysis.stats.shapes import EpochStats
    from memwatch.analysis.stats.trend import Trend

    def unit(closing: float | None) -> EpochStats:
        t = Trend(25, 0, 0, 1, 0, 0, 0, GIB, 0, 0)
        return EpochStats(0, "host.rss", 25, 25, 0.01, GIB, GIB, GIB, GIB, GIB, 0.0, t, 0.0,
                          256 * 1024, "flat", closing=closing)

    closings = [402.66, 413.34, 422.57, None, 447.98, 456.06, 464.06]
    hist = [unit(None if c is None else c * MIB) for c in closings]
    stair = 8.03 * MIB
    assert _period(hist, stair) == pytest.approx((464.06 - 402.66) / 6 * MIB)
    flat_first = [unit(c * MIB) for c in (380.0, 380.2, 380.1)] + hist
    assert _period(flat_first, stair) == pytest.approx((464.06 - 380.1) / 7 * MIB)
    # A leak whose periods add just the stair: the stair; no closings: the stair.
    even = [unit((400 + 8.03 * i) * MIB) for i in range(5)]
    assert _period(even, stair) == pytest.approx(stair)
    assert _period([unit(None), unit(None)], stair) == stair


def test_flat_checks_needed_follow_the_noise() -> None:
    from memwatch.analysis.stats.shapes import EpochStats
    from memwatch.analysis.stats.trend import Trend

    t = Trend(200, 0, 0, 1, 0, 0, 0, 0, 0, 0)
    cur = EpochStats(0, "host.rss", 200, 200, 0.01, GIB, GIB, GIB, GIB, GIB, 0.0, t, 0.0,
                     4 * MIB, "flat")
    assert flat_checks_needed(1 * MIB, cur) == 2  # 200 MiB a unit against 4 MiB
    assert flat_checks_needed(8 * 1024, cur) == 6  # 1.6 MiB a unit: capped at MAX_FLAT
    assert flat_checks_needed(16 * 1024, cur) == 3  # 3.2 MiB a unit: ceil(8 / 3.2)
    assert flat_checks_needed(8 * 1024, cur, full=True) == 1


def _rank(rank: int, leaking: bool) -> dict[str, Any]:
    f = [{"kind": "leak", "metric": "host.rss", "severity": "info", "bytes_per_step": MIB,
          "steps_to_oom": None, "culprit": "Model.kept"}] if leaking else []
    return {"rank": rank, "floor": {}, "peak": {}, "limits": {}, "findings": f}


def test_which_ranks_leak_is_judged_again_at_every_exchange(
        caplog: pytest.LogCaptureFixture) -> None:
    book, warner = Beliefs(), FindingWarner()
    said: list[Finding] = []
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        for check, ranks in enumerate(([1], [0, 1], [0, 1], [])):
            o = Origin(epoch=check, step=100 * (check + 1), check=check)
            got = book.across_ranks(cross_rank_findings(
                [_rank(r, r in ranks) for r in range(2)], [], 60.0, o), o)
            warner.tell(got, warn=False)
            said += got
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("memwatch: rank_leak in host.rss"), lines
    assert "host.rss leaks now on every rank (2) (was: rank(s) 1)" in lines[1], lines
    assert "withdrawn" in lines[2] and len(lines) == 3, lines
    assert [state_of(f) for f in current(said)] == ["stopped"]


def test_a_withdrawn_notice_is_never_said() -> None:
    """An unnamed leak's notice waits a check for its holder; the holder turns out bounded:
    the notice is dropped unsaid (the belief's leak state was never told)."""
    w = FindingWarner()
    leak = Finding(kind="leak", metric="host.rss", severity="info", message="grows.",
                   belief="train/host/1", evidence={"belief_state": "leak"})
    bounded = Finding(kind="plateau", metric="host.rss", severity="info", message="bounded.",
                      belief="train/host/1",
                      evidence={"belief_state": "bounded", "belief_change": "withdrawn"})
    w.tell([leak])
    w.end_check()
    w.tell([bounded])
    w.end_check()
    w.flush()
    assert "train/host/1" not in w.told


def test_a_native_memory_leak_is_weighed_on_the_in_use_bytes_it_named() -> None:
    """A native-memory verdict says the C allocator's in-use bytes grow. When they stop while
    RSS goes on growing from chunks the allocator keeps free (retention, its own finding), the
    leak belief is withdrawn on the in-use bytes' flat floors; RSS's growth does not keep it
    standing to the end of the run."""
    keys = ["host.rss", "host.malloc_in_use", "host.malloc_free"]
    tl, an = Timeline(keys), Analyzer(evidence=RecordedEvidence())
    grow = 8 * MIB / STEPS  # a step
    fs: list[Finding] = []
    for e in range(8):
        for i in range(STEPS):
            s = e * STEPS + i
            in_use = min(s, 3 * STEPS) * grow  # native growth for three epochs, then none
            free = max(s - 3 * STEPS, 0) * grow  # then freed chunks kept: RSS goes on
            tl.append(s + 1, float(s), [GIB + s * grow, 512 * MIB + in_use, 8 * MIB + free])
        end = (e + 1) * STEPS
        closing = {"host.rss": GIB + end * grow,
                   "host.malloc_in_use": 512 * MIB + min(end, 3 * STEPS) * grow,
                   "host.malloc_free": 8 * MIB + max(end - 3 * STEPS, 0) * grow}
        fs += an.check(tl.end_epoch(), CheckContext(
            origin=Origin(epoch=e, step=end, check=e), closing=closing,
            limits={"host.rss": 64 * GIB}, census="always"))
    native = [f for f in fs if f.evidence.get("pattern") == "native_memory"]
    assert native, [(f.kind, f.rule, f.evidence.get("pattern"), f.epoch) for f in fs]
    bid = native[0].belief
    states = [c["state"] for c in history(fs, bid)]
    assert states[0] == "leak" and states[-1] == "stopped", states
    stop = [f for f in fs if f.belief == bid and state_of(f) == "stopped"][-1]
    assert "in-use bytes stopped growing" in stop.message, stop.message
    assert [state_of(f) for f in current(fs) if f.belief == bid] == ["stopped"]
    assert any(f.kind == "allocator_retention" for f in fs if (f.epoch or 0) > 3)
