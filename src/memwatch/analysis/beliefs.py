"""Beliefs: one per suspected leak (and one per shape of one metric), revised at every check.

A verdict is a belief, not a one-off: the check that says "leak" is followed by others, and
each weighs the evidence again. :class:`Beliefs` keeps, per loop, metric family and holder, the
current judgment and the checks that changed it:

* a leak whose growth **stopped** — the floor flat for as many checks as the noise needs
  (:func:`flat_checks_needed`) and the holder's size flat where it can be measured again — is
  revised into a plateau that names where it stopped and its bound, and the leak verdict is
  withdrawn;
* growth into a holder that carries its own bound (``deque(maxlen=N)``, an ``lru_cache``'s
  ``maxsize``) is a plateau to come (the leak rule's part :mod:`.rules.leak.bounded`), and an
  earlier unnamed leak verdict of the same memory is withdrawn by it;
* growth that **resumes** turns a stopped belief back into a leak;
* on rank 0, which ranks leak is judged again at every exchange (:meth:`Beliefs.across_ranks`).

Every finding leaves the check with the belief it states (``Finding.belief``); a change of state
carries ``evidence["belief_change"]`` (one sentence: what the console says once). The surfaces
show :func:`current` (the latest finding of each belief) with its :func:`history`.

Example (a leak that stops)::

    >>> from memwatch.analysis.beliefs import current, history
    >>> fs = [{"kind": "leak", "metric": "host.rss", "belief": "train/host/1", "check": 1,
    ...        "epoch": 1, "step": 200, "severity": "info"},
    ...       {"kind": "plateau", "metric": "host.rss", "belief": "train/host/1", "check": 3,
    ...        "epoch": 3, "step": 400, "severity": "info",
    ...        "evidence": {"belief_state": "stopped"}}]
    >>> [f["kind"] for f in current(fs)]
    ['plateau']
    >>> describe(history(fs, "train/host/1"))
    'leak at epoch 1 (step 200) → stopped at epoch 3 (step 400)'
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from memwatch.analysis.evidence import HolderSize
from memwatch.analysis.rules.base import RuleInput
from memwatch.analysis.rules.leak.native import IN_USE
from memwatch.analysis.rules.leak.rule import BELIEF
from memwatch.analysis.rules.words import where
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding, Origin
from memwatch.core.units import fmt_bytes

__all__ = ["Belief", "Beliefs", "current", "describe", "flat_checks_needed", "history",
           "state_of"]

#: The states of a suspected leak: growing, filling its own bound, stopped.
LEAK_STATES = ("leak", "bounded", "stopped")
#: At most this many flat checks are asked for before growth counts as stopped (a leak so slow
#: that more would be needed could not have been confirmed in two checks either).
MAX_FLAT = 6
#: Beliefs kept per book (the oldest stopped ones go first): memory stays bounded.
MAX_BELIEFS = 64
#: Leak patterns whose evidence is the C allocator's in-use bytes (rules.leak.native).
IN_USE_PATTERNS = frozenset({"native_memory", "in_use_growth"})

F = TypeVar("F", bound=Finding | Mapping[str, Any])


def _get(f: Finding | Mapping[str, Any], name: str) -> Any:
    return f.get(name) if isinstance(f, Mapping) else getattr(f, name, None)


def _evidence(f: Finding | Mapping[str, Any]) -> Mapping[str, Any]:
    ev = _get(f, "evidence")
    return ev if isinstance(ev, Mapping) else {}


def state_of(f: Finding | Mapping[str, Any]) -> str:
    """The state a finding gives its belief: ``leak``, ``bounded``, ``stopped``, or its kind."""
    st = _evidence(f).get("belief_state")
    return str(st) if st else str(_get(f, "kind"))


def _key(f: Finding | Mapping[str, Any]) -> str:
    b = _get(f, "belief")
    if b:
        return str(b)
    # Saved before beliefs: one per loop, kind and metric (what the surfaces showed then).
    return f"{_get(f, 'stage') or 'train'}/{_get(f, 'metric')}/{_get(f, 'kind')}"


def current(findings: Iterable[F]) -> list[F]:
    """The current state of every belief: the latest finding of each, in the order they were
    last stated."""
    last: dict[str, F] = {}
    for f in findings:
        k = _key(f)
        last.pop(k, None)
        last[k] = f
    return list(last.values())


def history(findings: Iterable[Finding | Mapping[str, Any]], belief: str) -> list[dict[str, Any]]:
    """The changes of one belief, oldest first: each state it took, where (check, step, epoch,
    loop) and its severity then (a restated verdict is no change)."""
    out: list[dict[str, Any]] = []
    for f in findings:
        if _key(f) != belief:
            continue
        st = state_of(f)
        if out and out[-1]["state"] == st:
            continue
        out.append({"state": st, "check": _get(f, "check"), "step": _get(f, "step"),
                    "epoch": _get(f, "epoch"), "stage": _get(f, "stage") or "train",
                    "severity": _get(f, "severity")})
    return out


def describe(changes: Sequence[Mapping[str, Any]]) -> str:
    """A belief's history in one line: ``leak at epoch 1 (step 200) → stopped at epoch 3 ...``."""
    def at(c: Mapping[str, Any]) -> str:
        where_ = f"epoch {c['epoch']}" if c.get("epoch") is not None else f"check {c['check']}"
        return f"{c['state']} at {where_}" + (f" (step {c['step']})" if c.get("step") else "")

    return " → ".join(at(c) for c in changes)


def flat_checks_needed(rate: float, cur: EpochStats, full: bool = False,
                       placement: float = 0.0) -> int:
    """Checks in a row with a flat floor before growth at ``rate`` bytes a step counts as stopped.

    A unit is flat when its floor rose by less than its threshold (the magnitude floors and four
    times the measured noise). A leak still growing at its rate adds ``rate`` times the unit's
    steps every unit, so it is missed only while that stays within the noise: asked for is the
    number of flat units over which the old rate would have added twice the threshold (the same
    two checks' worth of evidence a leak verdict needs), never fewer than two (one flat unit is
    what a leaking RSS shows while the allocator hands out memory freed before) and at most
    :data:`MAX_FLAT`. A holder full at its own bound cannot grow (its bound is the mechanism):
    one flat check is enough. ``placement``: what moves a leak-free host floor between units
    (see :meth:`Beliefs._weigh`), counted in the threshold."""
    if full:
        return 1
    per_unit = rate * max(cur.n_steps, 1)
    if per_unit <= 0:
        return 2
    thr = max(cur.threshold, placement)
    return min(max(2, math.ceil(2 * thr / per_unit)), MAX_FLAT)


@dataclasses.dataclass
class Belief:
    """One judgment, kept across checks.

    Attributes:
        id: how findings name it (``Finding.belief``).
        stage, family, metric: the loop and the memory it is about (``host``: ``host.rss``).
        holder: the holder the census named (None until it is).
        state: ``leak``, ``bounded``, ``stopped``, or a finding kind for other shapes.
        latest: the finding that states it now; ``leak``: the leak verdict the current stretch of
            growth started with (what a stop withdraws).
        base: the floor before the growth (bytes), ``rate``: its last rate (bytes a step).
        flat: checks in a row whose floor did not rise; ``length``: the holder's items at the
            last check that measured it.
        series: the series the leak is weighed on when it is not ``metric``: the C allocator's
            in-use bytes for a leak no holder was named for and whose evidence they are (the
            verdict said *they* grow; RSS can go on growing from what the allocator keeps free,
            which is no evidence that they still do).
    """

    id: str
    stage: str
    family: str
    metric: str
    holder: str | None
    state: str
    latest: Finding
    leak: Finding | None = None
    base: float | None = None
    rate: float = 0.0
    flat: int = 0
    flat_since: int | None = None
    length: int | None = None
    size: HolderSize | None = None
    series: str | None = None


def _name(path: str) -> str:
    """The container a holder's path ends with (``all_hidden`` in ``tr.all_hidden`` and in
    ``._log.trainer → ... .trainer.all_hidden``): the same holder reached by two routes."""
    return re.split(r"[.\s→]+", re.sub(r"\[[^\]]*\]", "", path).strip(" .→"))[-1]


def _family(metric: str) -> str:
    return metric.split(".", 1)[0]


def _when(f: Finding | None) -> str:
    if f is None:
        return "an earlier check"
    if f.epoch is not None:
        return f"epoch {f.epoch} (check {f.check}, step {f.step})"
    return f"check {f.check} (step {f.step})"


def _leaky(f: Finding) -> bool:
    return f.kind == "leak" or (f.kind == "plateau" and f.evidence.get("pattern") == "bounded")


class Beliefs:
    """The beliefs of one session: every finding of a check is matched to one, and the ones a
    check said nothing new about are weighed again (see the module doc)."""

    def __init__(self) -> None:
        self._beliefs: dict[str, Belief] = {}
        self._n = 0

    @property
    def beliefs(self) -> list[Belief]:
        """Every belief kept, oldest first."""
        return list(self._beliefs.values())

    # ------------------------------------------------------------------ a check
    def revise(self, found: Sequence[Finding], inp: RuleInput) -> list[Finding]:
        """This check's findings, each naming its belief (a change of state said in its
        evidence), and the revisions of the leak beliefs it said nothing new about."""
        out: list[Finding] = []
        touched: set[str] = set()
        for f in found:
            b, new = self._match(f)
            touched.add(b.id)
            out.append(self._state(b, f, new, inp))
        stage = inp.ctx.origin.stage
        for b in list(self._beliefs.values()):
            if b.id in touched or b.stage != stage or b.state not in ("leak", "bounded") or \
                    b.id.startswith("ranks/"):
                continue  # (which ranks leak is weighed at each exchange: across_ranks)
            revised = self._weigh(b, inp)
            if revised is not None:
                out.append(revised)
        self._bound()
        return out

    def across_ranks(self, found: Sequence[Finding], origin: Origin) -> list[Finding]:
        """Rank 0's cross-rank findings of one exchange, each naming its belief; a change of
        which ranks leak is said ("now on every rank (2)"), and a metric no rank leaks any
        more is said once."""
        out: list[Finding] = []
        seen: set[str] = set()
        for f in found:
            if f.kind != "rank_leak":
                out.append(self._plain(f))
                continue
            bid = f"ranks/{f.metric}"
            seen.add(bid)
            ranks = list(f.evidence.get("ranks") or [])
            old = self._beliefs.get(bid)
            change = None
            if old is not None and list(old.latest.evidence.get("ranks") or []) != ranks:
                world = f.evidence.get("world_size")
                scope = (f"now on every rank ({world or len(ranks)})"
                         if not f.evidence.get("only_some_ranks") else
                         f"now only on rank(s) {', '.join(map(str, ranks))}")
                change = (f"{f.metric} leaks {scope} (was: rank(s) "
                          f"{', '.join(map(str, old.latest.evidence.get('ranks') or []))})")
            b = old or self._new(bid, f, "rank_leak")
            f = _annotated(f, b.id, "leak", change, b.state if old is not None else None)
            b.latest, b.state = f, "leak"
            out.append(f)
        for bid, b in list(self._beliefs.items()):
            if not bid.startswith("ranks/") or bid in seen or b.state != "leak":
                continue
            b.state = "stopped"
            msg = (f"No rank reports {b.metric} growing any more: the cross-rank leak verdict of "
                   f"{_when(b.latest)} is withdrawn.")
            b.latest = origin.finding(
                rule=BELIEF.name, kind="plateau", metric=b.metric, severity="info", message=msg,
                belief=bid, evidence={"pattern": "stopped", "belief_state": "stopped",
                                      "belief_change": msg, "belief_was": "leak"})
            out.append(b.latest)
        return out

    # ------------------------------------------------------------------ matching
    def _match(self, f: Finding) -> tuple[Belief, bool]:
        stage = f.stage
        if not _leaky(f):
            holder = f.evidence.get("holder")
            bid = f"{stage}/{f.metric}/{f.kind}" + (f"/{holder}" if holder else "")
            b = self._beliefs.get(bid)
            return (b, False) if b is not None else (self._new(bid, f, f.kind), True)
        fam, holder = _family(f.metric), f.evidence.get("holder") or None
        mine = [b for b in self._beliefs.values()
                if b.stage == stage and b.family == fam and b.state in LEAK_STATES]
        if holder is not None:
            same = [b for b in mine if b.holder == holder] or \
                [b for b in mine if b.holder is not None and _name(b.holder) == _name(holder)]
            if same:  # (the same container reached by another route: named as now)
                same[-1].holder = holder
                return same[-1], False
            unnamed = [b for b in mine if b.holder is None and b.state != "stopped"]
            if unnamed:  # the census named the holder of a leak said before it could
                unnamed[-1].holder = holder
                return unnamed[-1], False
        else:
            # An unnamed restatement of a leak believed now (a check whose census named no
            # holder); other growth of the family is a belief of its own.
            growing = [b for b in mine if b.state == "leak"]
            if growing:
                return growing[-1], False
        self._n += 1
        b = self._new(f"{stage}/{fam}/{self._n}", f, "")
        b.holder = holder
        return b, True

    def _new(self, bid: str, f: Finding, state: str) -> Belief:
        b = Belief(id=bid, stage=f.stage, family=_family(f.metric), metric=f.metric,
                   holder=f.evidence.get("holder") or None, state=state, latest=f)
        self._beliefs[bid] = b
        return b

    def _plain(self, f: Finding) -> Finding:
        b, _ = self._match(f)
        b.latest = f = _annotated(f, b.id, f.kind, None, None)
        return f

    # ------------------------------------------------------------------ states
    def _state(self, b: Belief, f: Finding, new: bool, inp: RuleInput) -> Finding:
        """``f`` as the statement of ``b``: its state, and the change it makes, in words."""
        if not _leaky(f):
            b.latest = f = _annotated(f, b.id, f.kind, None, None)
            return f
        st = "bounded" if f.kind == "plateau" else "leak"
        was = None if new else b.state
        change = None
        if was == "leak" and st == "bounded":
            bound = f.evidence.get("holder_bound") or {}
            change = (f"the leak verdict of {_when(b.leak)} is withdrawn: `{b.holder}` carries "
                      f"its own bound ({_bound_words(bound)}) and the memory it will hold "
                      "then fits")
        elif was == "stopped" and st == "leak":
            change = (f"{_what(b)} grows again: it had stopped at {_when(b.latest)}; the leak "
                      "verdict stands again")
        elif was == "bounded" and st == "leak":
            change = f"{_what(b)} will not fit within its own bound: a leak after all"
        hist = inp.history.get(f.metric) or []
        if st == "leak" and was != "leak":
            b.leak = f
            b.base = min((h.floor for h in hist), default=None)
        elif was is None and hist:
            b.base = min(h.floor for h in hist)
        b.rate = float(f.bytes_per_step or b.rate)
        b.flat, b.flat_since = 0, None
        if b.holder is not None:
            size = inp.evidence.holder_size(b.holder)
            if size is not None:
                b.length, b.size = size.length, size
        b.metric = f.metric
        b.series = IN_USE if st == "leak" and b.holder is None and \
            f.evidence.get("pattern") in IN_USE_PATTERNS else None
        b.state = st
        b.latest = f = _annotated(f, b.id, st, change, was)
        return f

    def _weigh(self, b: Belief, inp: RuleInput) -> Finding | None:
        """A leak belief this check said nothing new about: still growing, or stopped?"""
        series = b.series if b.series is not None and inp.history.get(b.series) else b.metric
        hist = inp.history.get(series)
        if not hist:
            return None
        cur = hist[-1]
        prev = hist[-2] if len(hist) >= 2 else None
        # Growth is what the unit's noise cannot explain and, for host memory, more than where
        # glibc places each unit's allocations moves a leak-free floor (AnalyzerConfig.
        # unnamed_min_growth, measured on the corpus controls): a stopped leak's RSS still
        # creeps by a MiB or two as the allocator settles.
        thr = max(cur.threshold, _placement(series, inp))
        grew = (cur.shape == "growing" and cur.growth > thr) or cur.rise > thr or \
            (cur.stair or 0.0) > thr or (prev is not None and cur.floor - prev.lo_end > thr)
        size = inp.evidence.holder_size(b.holder) if b.holder is not None else None
        full = size is not None and size.bound is not None and size.bound.full
        if size is not None:
            more = b.length is not None and size.length > b.length
            # A holder full at its own bound that gained nothing cannot be what still grows
            # (another holder is): its own growth stopped, whatever the floor does.
            grew = more or (grew and not full)
            b.length, b.size = size.length, size
        if grew:
            b.flat, b.flat_since = 0, None
            return None
        b.flat += 1
        if b.flat_since is None:
            # Where the growth stopped: this unit's start, or the previous unit's when it was
            # flat inside too (its floor only held what came before it).
            b.flat_since = inp.summary.start_step
            if prev is not None and prev.shape != "growing" and prev.rise <= thr:
                b.flat_since = max(inp.summary.start_step - prev.n_steps, 0)
        if b.flat < flat_checks_needed(b.rate, cur, full, _placement(series, inp)):
            return None
        return self._stopped(b, (inp.history.get(b.metric) or hist)[-1], inp.ctx.origin,
                             weighed_on=series)

    def _stopped(self, b: Belief, cur: EpochStats, origin: Origin,
                 weighed_on: str | None = None) -> Finding:
        """``b`` stopped (``cur``: its metric's latest unit); ``weighed_on``: the series whose
        flat floors said so, where it is not the metric."""
        was = b.state
        held = cur.floor - b.base if b.base is not None else None
        size, bound = b.size, b.size.bound if b.size is not None else None
        at = ", ".join(x for x in (
            f"{size.length:,} items" if size is not None else "",
            fmt_bytes(held) if held is not None and held > 0 else "") if x)
        own = f" (`{bound.describe()}`)" if bound is not None else ""
        flat = (f"flat for {b.flat} check{'s' if b.flat > 1 else ''}"
                + (f" since step {b.flat_since}" if b.flat_since is not None else ""))
        if was == "bounded":
            msg = (f"{_what(b)} filled its bound and stopped at {at or 'its bound'}{own}, as "
                   f"expected: {flat}.")
            change = None
        elif weighed_on == IN_USE and b.metric != IN_USE:
            msg = (f"The C allocator's in-use bytes stopped growing: {flat}. The native-memory "
                   f"leak verdict of {_when(b.leak)} on {b.metric} is withdrawn; any growth "
                   f"of {b.metric} from here on is judged on its own.")
            change = msg
        else:
            msg = (f"{_what(b)} stopped growing at {at or 'its level'}{own}: {flat}. The leak "
                   f"verdict of {_when(b.leak)} is withdrawn; what it holds stays held.")
            change = msg
        b.state = "stopped"
        ev: dict[str, Any] = {"pattern": "stopped", "belief_state": "stopped", "belief_was": was,
                              "flat_checks": b.flat, "flat_since_step": b.flat_since,
                              "held_bytes": held, "withdraws": _ref(b.leak)}
        if b.holder is not None:
            ev["holder"] = b.holder
        if size is not None:
            ev["holder_len"] = size.length
        if bound is not None:
            ev["holder_bound"] = bound.to_dict()
        if change is not None:
            ev["belief_change"] = change
        b.latest = origin.finding(rule=BELIEF.name, kind="plateau", metric=b.metric,
                                  severity="info", message=msg, culprit=b.holder,
                                  belief=b.id, evidence=ev)
        return b.latest

    def _bound(self) -> None:
        if len(self._beliefs) <= MAX_BELIEFS:
            return
        done = [k for k, b in self._beliefs.items() if b.state not in ("leak", "bounded")]
        for k in done[:len(self._beliefs) - MAX_BELIEFS]:
            del self._beliefs[k]


def _placement(metric: str, inp: RuleInput) -> float:
    """Where glibc places each unit's allocations moves a leak-free host floor by this much:
    resident memory's, never the allocator's own counts (in-use bytes are what was handed out
    and not freed, exactly)."""
    if metric.startswith("host.") and not metric.startswith("host.malloc_"):
        return inp.cfg.unnamed_min_growth
    return 0.0


def _what(b: Belief) -> str:
    return f"`{b.holder}`" if b.holder else where(b.metric)


def _bound_words(bound: Mapping[str, Any]) -> str:
    kind, cap = bound.get("kind"), bound.get("capacity")
    if kind == "lru_cache":
        return f"`functools.lru_cache(maxsize={cap})`"
    return f"`deque(maxlen={cap})`"


def _ref(f: Finding | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"check": f.check, "step": f.step, "epoch": f.epoch, "severity": f.severity}


def _annotated(f: Finding, bid: str, state: str, change: str | None,
               was: str | None) -> Finding:
    ev = dict(f.evidence)
    ev["belief_state"] = state
    if change is not None:
        ev["belief_change"] = change
        ev["belief_was"] = was
    return dataclasses.replace(f, belief=bid, evidence=ev)
