"""Host growth that no live Python object explains: native memory, or the allocator keeping freed
memory? The C allocator's own figures decide (glibc ``mallinfo2``, read in the background as
``host.malloc_in_use`` and ``host.malloc_free``: :mod:`memwatch.probes.malloc`).

A part of the leak rule (:mod:`.rule` runs it), when a host leak verdict's census explains too
little of the growth; its findings name it (``Finding.rule == "native"``) and say which of these
it is in ``evidence["pattern"]`` (a ``leak``'s variant, as ``docs/findings.md`` lists them):

* **native memory** — the allocator's in-use bytes grew with RSS (at least half of it): memory
  handed out and not freed, by code no census sees (a C/C++ extension, a compiled or traced
  module registry, an autograd graph kept by a C++ reference cycle, a library's own cache). A
  ``leak`` (``evidence["pattern"] == "native_memory"``), severity by consequence.
* **allocator retention** — in-use bytes stayed flat while RSS grew and the allocator's free
  bytes grew instead (at least half of it), or its heap's total (in-use and free bytes, read
  together at the checks) grew by at least half of what RSS grew between the same checks: it
  keeps memory that was freed (glibc arenas fragment under many threads and mixed sizes; step
  outputs kept for an epoch and freed at its end leave the heap larger when the next epoch does
  not reuse them). Free bytes' *floors* alone miss that: inside a unit they trade places with
  in-use bytes, so their low is taken while the memory is in use. ``allocator_retention``,
  with the allocator's figures as evidence, and allocator advice. Severity ``info`` while what
  it kept grew by less than glibc's largest trim threshold (:data:`GLIBC_KEEPS`, 64 MiB):
  keeping that much is the allocator's design, and forecasting an OOM from it extrapolates a
  warm-up.
* **outside the C heap, or no evidence** — none of these grew (RSS grew outside ``malloc``:
  Python's own small-object arenas, which it maps itself, thread stacks, mappings a library
  makes), or ``mallinfo2`` does not exist (musl, macOS, glibc before 2.33): a ``leak`` (pattern
  ``unexplained``) that says what memwatch could and could not see, with no allocator advice,
  and ``tracemalloc=True`` suggested (it settles whether Python allocations grow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.evidence import Attribution
from memwatch.analysis.rules.base import SubRule
from memwatch.analysis.rules.words import forecast_words, span, where
from memwatch.analysis.stats.held import SIMILAR
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["IN_USE", "PART", "HeapGrowth", "at_checks", "heap_growth", "in_use_at_checks_held",
           "in_use_held", "in_use_leak", "in_use_stairs", "native_or_retention"]

#: This part of the leak rule, as its findings name it.
PART = SubRule(name="native", kinds=frozenset({"leak", "allocator_retention"}))

IN_USE = "host.malloc_in_use"
FREE = "host.malloc_free"
#: In-use bytes that grew by at least this share of the RSS growth: native memory.
NATIVE_SHARE = 0.5
#: Free bytes glibc keeps by design: its trim threshold, which rises with its dynamic mmap
#: threshold up to twice ``DEFAULT_MMAP_THRESHOLD_MAX`` (4 MiB * sizeof(long): 32 MiB on 64-bit;
#: mallopt(3)). Free memory at the top of the heap below it is never returned, so retention that
#: grew by less is the allocator's ordinary keeping after a warm-up, no threat to extrapolate.
GLIBC_KEEPS = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class HeapGrowth:
    """The C allocator's in-use and free bytes over the stretch a host verdict judged."""

    in_use: float
    in_use_threshold: float
    #: Free bytes' growth, floor to floor: free memory the run did not reuse even at its peak.
    free: float | None
    #: The heap's total (in-use and free bytes, read together) and RSS, from the first unit's
    #: check to the last's: each a reading of one instant, so the two compare where floors
    #: (taken at different moments of a unit) do not. None where a check's reading is missing.
    heap_at_checks: float | None = None
    rss_at_checks: float | None = None
    #: In-use bytes alone, first check to last (None where a check's reading is missing).
    in_use_at_checks: float | None = None

    def native(self, rss_growth: float) -> bool:
        """In-use bytes grew with RSS (at least half of it) between the checks: a census pair
        explains the stretch from one check to the other, and in-use bytes handed out only
        before the first (a bounded buffer's last fill, read at the unit's one background
        reading before its check) are no memory of that stretch to claim as native.

        The share is judged on the checks' closing readings where the checks read both: each
        one instant at the same place in the loop, as many per unit however fast the machine
        runs. In-use floors are read from the background passes (a pass's values restated at
        a step), whose number a unit holds follows the wall clock: beside a busy machine a
        unit lasts longer and holds more of them, and the first unit's floor after its warm-up
        is the reading then in force, taken earlier the fewer there are (the same run's
        in-use floors grew by 8.6 MiB quiet and 5.2 MiB beside two busy loops, for raw minima
        that grew by 9.5 in both: one verdict native memory, the other retention). Floors,
        ``rss_growth`` among them, decide only where a check's reading is missing."""
        at = self.in_use_at_checks
        if at is not None:
            if at <= self.in_use_threshold:
                return False
            if self.rss_at_checks is not None and self.rss_at_checks > 0:
                return at >= NATIVE_SHARE * self.rss_at_checks
        return self.in_use > self.in_use_threshold and \
            self.in_use >= NATIVE_SHARE * max(rss_growth, 0.0)

    @property
    def in_use_words(self) -> str:
        """The in-use growth the share was judged on, in words: between the checks' closing
        readings where both were read (what :meth:`native` decides on), else floor to floor."""
        if self.in_use_at_checks is not None:
            return f"{fmt_bytes(self.in_use_at_checks)} between the checks"
        return f"{fmt_bytes(self.in_use)} over the same stretch"

    def retained(self, rss_growth: float) -> bool:
        """The allocator keeps what RSS gained (at least half of it): its free bytes' floors
        grew by that much, or its heap grew with RSS between the checks. Free bytes trade
        places with in-use bytes inside a unit (a step's temporaries, outputs kept for an
        epoch), so their floors can miss memory the heap took and keeps; the heap's total at
        the checks cannot."""
        if self.free is not None and self.free >= NATIVE_SHARE * max(rss_growth, 0.0):
            return True
        return self._heap_took_it()

    def _heap_took_it(self) -> bool:
        return self.heap_at_checks is not None and self.rss_at_checks is not None and \
            self.rss_at_checks > 0 and self.heap_at_checks >= NATIVE_SHARE * self.rss_at_checks

    @property
    def kept(self) -> float:
        """What the allocator was seen to keep: free bytes' growth, or the heap's growth
        between the checks where that is the evidence."""
        free = self.free or 0.0
        return max(free, self.heap_at_checks or 0.0) if self._heap_took_it() else free


def _by_unit(history: Mapping[str, list[EpochStats]], metric: str) -> dict[str, EpochStats]:
    """``metric``'s stats keyed by unit (``"e3"``, ``"s7"``): the units a host verdict judged."""
    return {h.unit: h for h in history.get(metric, [])}


def at_checks(a: EpochStats | None, b: EpochStats | None) -> float | None:
    """How much a metric grew from the check that closed ``a`` to the one that closed ``b``
    (their closing readings); None where either is missing."""
    if a is None or b is None or a.closing is None or b.closing is None:
        return None
    return b.closing - a.closing


def heap_growth(history: Mapping[str, list[EpochStats]],
                units: list[EpochStats]) -> HeapGrowth | None:
    """How the allocator's figures moved over ``units`` (host RSS's; first floor to last, and
    first check to last), with the in-use series' own noise; None when they are not sampled."""
    by_unit = _by_unit(history, IN_USE)
    a, b = by_unit.get(units[0].unit), by_unit.get(units[-1].unit)
    if a is None or b is None:
        return None
    free_units = _by_unit(history, FREE)
    fa, fb = free_units.get(units[0].unit), free_units.get(units[-1].unit)
    between = [by_unit[u.unit] for u in units if u.unit in by_unit]
    in_use_at, free_at = at_checks(a, b), at_checks(fa, fb)
    return HeapGrowth(in_use=b.floor - a.floor,
                      in_use_threshold=max(h.threshold for h in between),
                      free=None if fa is None or fb is None else fb.floor - fa.floor,
                      heap_at_checks=None if in_use_at is None or free_at is None
                      else in_use_at + free_at,
                      rss_at_checks=at_checks(units[0], units[-1]), in_use_at_checks=in_use_at)


def in_use_held(history: Mapping[str, list[EpochStats]], hist: list[EpochStats],
                cfg: AnalyzerConfig) -> bool:
    """The held-growth rule (:func:`memwatch.analysis.stats.held.verdict`) confirms a leak on
    the C allocator's in-use bytes over ``hist``'s last units (host RSS), and RSS rose with them
    (by at least :data:`NATIVE_SHARE` of the in-use rise, and by more than its own noise).

    The same rule on a cleaner series. In-use bytes count what was handed out and not freed,
    exactly: RSS stalls while the allocator hands out chunks it had kept free (a census frees
    megabytes of them at every check), then jumps; and its threshold carries the uncertainty of
    memwatch's own growth at checks, which in-use bytes measure exactly (the same counters read
    around each check: what the checks keep is taken out of the series). A steady leak's RSS
    floors can then miss the rule for a check, for reasons that are the allocator's timing, not
    the run's."""
    by_unit = _by_unit(history, IN_USE)
    units = [by_unit.get(h.unit) for h in hist[-3:]]
    if len(units) < 2 or any(u is None for u in units):
        return False
    heap = [u for u in units if u is not None]
    if cfg.held(heap) != "leak":
        return False
    in_use_rise = heap[-1].floor - heap[0].floor
    rss_rise = hist[-1].floor - hist[-len(heap)].floor
    return rss_rise >= NATIVE_SHARE * in_use_rise and rss_rise > hist[-1].threshold


def in_use_at_checks_held(history: Mapping[str, list[EpochStats]], hist: list[EpochStats],
                          cfg: AnalyzerConfig) -> bool:
    """The C allocator's in-use bytes, read at the last three checks, rose at both of the last
    two by similar amounts (within :data:`~memwatch.analysis.stats.held.SIMILAR`, the second not
    slower than ``cfg.deceleration`` of the first: a cache filling levels off), each above the
    in-use series' noise and RSS's threshold over its unit, and RSS rose with them between the
    same checks (by at least
    :data:`NATIVE_SHARE` of the two, and by more than its own threshold).

    Memory handed out and still in use at two boundaries in a row, at a steady pace: held
    growth, read where the loop's temporaries are freed (each check's closing reading is one
    instant at the same place in the loop, whatever the wall clock). The in-use floors
    :func:`in_use_held` judges come from the background passes, whose readings land in a unit
    where the clock puts them: with units of a fraction of a second a unit holds one or two,
    taken early or late, and their shapes and stairs follow that timing. RSS alone misses such
    a leak where the allocator hands the leak chunks that memwatch's own previous check, or the
    run, freed: a unit's RSS then rises at half the leak's pace and reads as slowing down."""
    if len(hist) < 3 or hist[-2].closing is None:  # each of the three checks read RSS
        return False
    by_unit = _by_unit(history, IN_USE)
    a, b, c = (by_unit.get(h.unit) for h in hist[-3:])
    first, second, rss_rise = at_checks(a, b), at_checks(b, c), at_checks(hist[-3], hist[-1])
    if first is None or second is None or rss_rise is None:
        return False
    # Each rise must pass the in-use series' noise (its least inflated unit threshold: a unit
    # holding one restated reading step reads that step as noise, which no closing reading
    # carries) and RSS's threshold over the same unit: growth RSS would have resolved.
    noise = min(u.threshold for u in (a, b, c) if u is not None)
    if first <= max(noise, hist[-2].threshold) or second <= max(noise, hist[-1].threshold) or \
            second < cfg.deceleration * first or second > first / SIMILAR:
        return False
    return rss_rise >= NATIVE_SHARE * (first + second) and rss_rise > hist[-1].threshold


def in_use_stairs(history: Mapping[str, list[EpochStats]], hist: list[EpochStats],
                  cfg: AnalyzerConfig) -> float | None:
    """Two equal stairs held (:func:`~memwatch.analysis.stats.held.held_stairs`) on the C
    allocator's in-use bytes over ``hist``'s last two units, and RSS rose with them: by at least
    :data:`NATIVE_SHARE` of the two stairs from the previous unit's end floor to this unit's
    check (two quiet readings), or to its peak and by more than its own threshold; the stair,
    or None.

    RSS shows a boundary's memory late when the allocator hands out chunks it kept free (a 4 MiB
    tensor kept by a validation reused freed heap, and RSS grew over the next epoch instead);
    in-use bytes count what was handed out at once, exactly, so the stairs show there at the
    boundary that made them."""
    by_unit = _by_unit(history, IN_USE)
    units = [by_unit.get(h.unit) for h in hist[-2:]]
    if len(units) < 2 or any(u is None for u in units):
        return None
    heap = [u for u in units if u is not None]
    stair = cfg.stairs(heap)
    if stair is None:
        return None
    need = NATIVE_SHARE * 2 * stair
    closing = hist[-1].closing
    if closing is not None and closing - hist[-2].lo_end >= need:
        # Between two quiet readings (the previous unit's end floor, this unit's check): no
        # step's temporaries in either, so the unit's threshold, which the step RSS took inside
        # it inflates (a 6 MiB rise read as 16 MiB of noise), is no noise of theirs.
        return stair
    top = max(hist[-1].peak, closing or hist[-1].peak)
    rss_rise = top - hist[-2].lo_end
    return stair if rss_rise >= need and rss_rise > hist[-1].threshold else None


def native_or_retention(*, origin: Origin, metric: str, units: list[EpochStats], slope: float,
                        rss_growth: float, heap: HeapGrowth | None, attribution: Attribution,
                        limit: float | None, limit_name: str | None,
                        steps_to_oom: float | None, seconds_to_oom: float | None,
                        severity: Severity, remaining: float, run_known: bool) -> Finding:
    """The finding for host growth live objects do not explain (see the module doc)."""
    explained = ("live tensors and Python objects explain "
                 f"{fmt_bytes(attribution.explained_bytes or 0)} of "
                 f"{fmt_bytes(attribution.rss_growth_bytes or rss_growth)}")
    forecast = forecast_words(limit, steps_to_oom, seconds_to_oom, severity, remaining,
                              run_known, limit_name)
    ev = {**attribution.evidence(), "limit_bytes": limit, "limit_name": limit_name,
          "rss_growth_bytes": rss_growth}
    # What the census named explains too little to hold this growth (the finding says no
    # Python object holds it): no surface says "held by" it, and no belief is keyed by it.
    held = {k: ev.pop(k) for k in [k for k in ev if k.startswith("holder")]}
    if held.get("holder"):
        ev["census_candidate"] = held["holder"]
    if heap is not None:
        ev.update(malloc_in_use_growth_bytes=heap.in_use, malloc_free_growth_bytes=heap.free,
                  malloc_in_use_growth_at_checks_bytes=heap.in_use_at_checks,
                  malloc_heap_growth_at_checks_bytes=heap.heap_at_checks,
                  rss_growth_at_checks_bytes=heap.rss_at_checks)
    common = dict(metric=metric, bytes_per_step=slope, steps_to_oom=steps_to_oom,
                  seconds_to_oom=seconds_to_oom)
    if heap is not None and heap.native(rss_growth):
        msg = (f"{where(metric)} grows by {fmt_bytes(slope)} per step, and the C allocator's "
               f"in-use bytes grew with it ({heap.in_use_words}), "
               f"but {explained}: memory is handed out and not freed by code no census sees "
               "(a C/C++ extension, a compiled or traced module registry, an autograd graph "
               "kept by a reference cycle through C++, a library's own cache)." + forecast)
        return origin.finding(
            rule=PART.name, kind="leak", severity=severity, message=msg,
            culprit="native memory: the C allocator's in-use bytes grow, no Python object "
                    "holds them",
            suggestions=[
                "Run with `MemWatch(tracemalloc=True)` for an epoch or two: if traced Python "
                "allocations grow as much, a line of Python allocates it and memwatch names "
                "it; if not, the growth is native.",
                "Look for code that creates things every step and keeps them in C++: "
                "`torch.jit.trace`/`torch.compile` on new shapes or new functions (each "
                "compiles and caches), new CUDA streams or handles, C extensions' caches.",
                "Autograd graphs kept alive by a cycle through C++ (a tensor hook or a "
                "custom Function that stores the tensor it is attached to): break the cycle, "
                "store `.detach()`.",
            ],
            evidence={"pattern": "native_memory", **ev}, **common)
    if heap is not None and heap.retained(rss_growth):
        if heap.kept < GLIBC_KEEPS:
            severity = "info"  # what glibc keeps by design: said, never warned about
        free = f"; its free bytes grew by {fmt_bytes(heap.free or 0)}"
        if heap.kept > (heap.free or 0.0):
            free += (f", and its heap by {fmt_bytes(heap.heap_at_checks or 0)} between the "
                     f"checks, as RSS grew by {fmt_bytes(heap.rss_at_checks or 0)}")
        msg = (f"{where(metric)} grows by {fmt_bytes(slope)} per step, but the C allocator's "
               f"in-use bytes did not ({heap.in_use_words}{free}) "
               f"and {explained}: the allocator keeps memory that was freed (glibc arenas "
               "fragment under many threads and mixed allocation sizes); no code of yours "
               "holds it." + forecast)
        return origin.finding(
            rule=PART.name, kind="allocator_retention", severity=severity, message=msg,
            suggestions=[
                "Limit glibc arenas: `MALLOC_ARENA_MAX=2` in the environment.",
                "Return free memory to the OS at epoch ends: "
                "`ctypes.CDLL('libc.so.6').malloc_trim(0)`.",
                "Use jemalloc or tcmalloc (`LD_PRELOAD=libjemalloc.so.2`), which fragment "
                "less.",
            ],
            evidence=ev, **common)
    if heap is not None:
        seen = (f" Neither the C allocator's in-use bytes ({heap.in_use_words}) nor its "
                f"free bytes ({fmt_bytes(heap.free or 0)}) grew as much: the memory is outside "
                "malloc's heap (Python's own small-object arenas, which it maps itself; thread "
                "stacks; memory a library maps).")
    else:
        seen = (" Without the C allocator's figures (glibc's mallinfo2 is not available here) "
                "memwatch cannot tell memory held by native code from freed memory the "
                "allocator keeps.")
    msg = f"{where(metric)} grows by {fmt_bytes(slope)} per step and {explained}." + seen + \
        forecast
    return origin.finding(
        rule=PART.name, kind="leak", severity=severity, message=msg,
        culprit="memory outside Python objects: native code or the allocator (undecided)",
        suggestions=[
            "Run with `MemWatch(tracemalloc=True)` for an epoch or two: if traced Python "
            "allocations grow as much, memwatch names the line that allocates them.",
            "Look for native caches that grow every step: `torch.jit`/`torch.compile` on new "
            "shapes, C extensions, new CUDA streams or handles.",
        ],
        evidence={"pattern": "unexplained", **ev}, **common)


def in_use_leak(*, origin: Origin, metric: str, units: list[EpochStats], slope: float,
                heap: HeapGrowth, limit: float | None, limit_name: str | None,
                steps_to_oom: float | None, seconds_to_oom: float | None, severity: Severity,
                remaining: float, run_known: bool) -> Finding:
    """Host growth held across checks that the allocator's in-use bytes confirm, said before a
    census pair can name what holds it (the next check does)."""
    msg = (f"{where(metric)} grows by {fmt_bytes(slope)} per step {span(units)}, and the C "
           f"allocator's in-use bytes grew with it ({heap.in_use_words}): memory is "
           "handed out and kept, not freed memory the allocator holds on "
           "to. What holds it is not named yet: naming needs a census at two checks, and this "
           "check's is the first; the next check names the holder." +
           forecast_words(limit, steps_to_oom, seconds_to_oom, severity, remaining, run_known,
                          limit_name))
    return origin.finding(
        rule=PART.name, kind="leak", metric=metric, severity=severity, message=msg,
        bytes_per_step=slope, steps_to_oom=steps_to_oom, seconds_to_oom=seconds_to_oom,
        culprit=None,
        suggestions=["Wait for the next check: it names the container or object that grows.",
                     "To name it now, run with `MemWatch(tracemalloc=True)`: traced Python "
                     "allocations are named by the line that made them."],
        evidence={"pattern": "in_use_growth", "malloc_in_use_growth_bytes": heap.in_use,
                  "malloc_in_use_growth_at_checks_bytes": heap.in_use_at_checks,
                  "malloc_free_growth_bytes": heap.free, "limit_bytes": limit,
                  "limit_name": limit_name, "floors": [u.floor for u in units]})
