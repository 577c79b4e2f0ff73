"""Findings a person can read: messages, culprits and suggestions specific to the culprit."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from memwatch.analysis.attribution import Attribution
from memwatch.analysis.culprits import container_culprit, graph_culprit
from memwatch.analysis.shapes import EpochStats
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes, fmt_duration


def _where(metric: str) -> str:
    return {
        "device.allocated": "Memory allocated by tensors on the accelerator",
        "device.reserved": "Memory reserved by the accelerator's caching allocator",
        "host.rss": "This process's resident host memory (RSS)",
        "host.uss": "This process's private host memory (USS)",
        "host.rss_anon": "This process's anonymous resident memory (the heap, anonymous maps)",
        "host.rss_shmem": "This process's resident shared memory (/dev/shm, memfd)",
        "workers.uss": "Private memory (USS) of the DataLoader worker processes",
        "workers.rss": "Resident memory of the DataLoader worker processes",
        "cgroup.working_set": ("The job's memory cgroup (this process, its workers and the rest "
                               "of the job, page cache it can reclaim excluded)"),
    }.get(metric, metric)


def _ci(slope_ci: tuple[float, float]) -> str:
    lo, hi = slope_ci
    return f"95% CI {fmt_bytes(lo)}–{fmt_bytes(hi)} per step"


# --------------------------------------------------------------------------- leaks

def _span(stats: list[EpochStats]) -> str:
    """"over 3 epochs" / "across 4 checks": what the units judged were."""
    if stats and stats[-1].unit.startswith("s"):
        return f"across {len(stats)} checks"
    return f"over {len(stats)} epochs"


def forecast_words(limit: float | None, steps_to_oom: float | None,
                   seconds_to_oom: float | None, severity: Severity, remaining: float,
                   run_known: bool) -> str:
    """The forecast in words, for a threat ("reached in about 1,200 steps (40 min)") or not
    ("9 years away ...: not a threat to this run")."""
    if limit is None:
        return " No memory limit is known to forecast against."
    if steps_to_oom is None:
        return ""
    if severity != "info":
        return (f" At this rate the {fmt_bytes(limit)} limit is reached in about "
                f"{steps_to_oom:,.0f} steps ({fmt_duration(seconds_to_oom)}).")
    after = (f", after this run ends ({remaining:,.0f} steps left)" if run_known else
             f", beyond the {fmt_duration(remaining * (seconds_to_oom or 0) / steps_to_oom)} "
             "horizon" if steps_to_oom else "")
    return (f" At this rate the {fmt_bytes(limit)} limit is {fmt_duration(seconds_to_oom)} away "
            f"({steps_to_oom:,.0f} steps){after}: not a threat to this run.")


def leak(*, origin: Origin, metric: str, stats: list[EpochStats], slope: float,
         slope_ci: tuple[float, float], limit: float | None, peak_now: float,
         steps_to_oom: float | None, seconds_to_oom: float | None, severity: Severity,
         attribution: Attribution, remaining: float, run_known: bool) -> Finding:
    cur = stats[-1]
    n_ep = sum(1 for s in stats if s.shape == "growing") or 1
    culprit, suggestions, detail = _culprit(metric, attribution)
    msg = (
        f"{_where(metric)} grows by {fmt_bytes(slope)} per step ({_ci(slope_ci)}) and is not "
        f"released: its floor rose by {fmt_bytes(cur.floor - stats[0].floor)} "
        f"(to {fmt_bytes(cur.floor)}) {_span(stats)}."
    )
    msg += forecast_words(limit, steps_to_oom, seconds_to_oom, severity, remaining, run_known)
    if detail:
        msg += " " + detail
    evidence = {
        "slope_bytes_per_step": slope,
        "slope_ci_low": slope_ci[0],
        "slope_ci_high": slope_ci[1],
        "mann_kendall_p": cur.trend.p,
        "mann_kendall_z": cur.trend.z,
        "lag1_autocorrelation": cur.trend.r1,
        "epoch_floors": [s.floor for s in stats[-6:]],
        "epoch_peaks": [s.peak for s in stats[-6:]],
        "epochs_growing": n_ep,
        "limit_bytes": limit,
        "peak_bytes": peak_now,
        **attribution.evidence(),
        "remaining_steps": remaining,
    }
    return origin.finding(kind="leak", metric=metric, severity=severity, message=msg,
                          bytes_per_step=slope, steps_to_oom=steps_to_oom,
                          seconds_to_oom=seconds_to_oom, culprit=culprit,
                          suggestions=suggestions, evidence=evidence)


def _culprit(metric: str, a: Attribution) -> tuple[str | None, list[str], str]:
    g = a.group
    h = a.holder
    if a.site is not None and (h is None or a.container is not None):
        return _site_culprit(a)
    if a.container is not None:
        return container_culprit(a)
    if g is None:
        if metric.startswith("host.") and a.python_object_growth:
            top = ", ".join(f"{n} (+{d})" for n, d in a.python_object_growth[:3])
            return (f"Python objects: {top}", [
                "Growing Python objects, not tensors: look for containers that are appended to "
                "every step (lists of dicts, logs of metrics) and bound or clear them.",
                "For the line that allocates them, run with `MemWatch(tracemalloc=True)` (it "
                "costs time on every Python allocation: an epoch or two is enough).",
            ], "")
        if a.census_note is not None:  # no census to compare: say why, and how to get one
            return (None, [
                "The culprit is named from a census of live tensors at two epoch ends; it was "
                f"{a.census_note}. Run with census='always' (the default 'auto' takes one whenever "
                "growth is suspected and it is cheap), or open an OOM bundle's census.json.",
            ], "")
        return (None, [
            "No growing group of live tensors was found between the last two censuses: the "
            "memory is held outside Python-visible tensors (native code, the allocator); "
            "`memwatch inspect` on a bundle shows the allocator state.",
        ], "")
    group = g.group
    what = f"+{g.count_delta} × {group.describe()}"
    if group.views and g.bytes_delta > 0:
        what += (f", views that keep their bases' storage alive (+{fmt_bytes(g.bytes_delta)}"
                 " since the last check)")
        detail = ("The growing tensors are views (slices, `.view()`, `.flatten()` of a "
                  "contiguous tensor): each keeps the whole tensor it was taken from.")
    graph = a.graph_bytes or 0
    suggestions: list[str] = []
    if group.views and g.bytes_delta > 0:
        suggestions.append("Keep a copy of the part you need, not a view of the whole: "
                           "`t[..., :k].clone()` (or `.detach().clone()`), which frees the base.")
    else:
        detail = ""
    if g.graph_nodes_delta > 0 and g.count_delta <= 0:
        return graph_culprit(a)
    if group.grad_fn:
        per = f" (each keeps its autograd graph: about {fmt_bytes(graph)} of saved tensors)" \
            if graph else " (each keeps its autograd graph and saved activations)"
        what += per
        detail = (f"The growing tensors have grad_fn={group.grad_fn}: every one held keeps its "
                  "whole autograd graph alive, saved activations included.")
        suggestions.append(
            "Keep numbers, not graphs: store `loss.item()` (a Python float) or `loss.detach()` "
            "instead of the tensor."
        )
        suggestions.append(
            "If these come from evaluation, run it under `torch.no_grad()` or "
            "`torch.inference_mode()`, and `.detach().cpu()` anything you keep."
        )
    if a.alloc_sites:  # who holds them, and where they were allocated
        site = a.alloc_sites[0]
        what += f", allocated at {site.where}"
        detail += (f" The allocator's recorded history puts {site.tensors} of them at "
                   f"{site.where} ({' ← '.join(site.frames[:3])}).")
    culprit = what
    if h is not None:
        culprit = f"{h.describe(g.count_delta if h.container else None)} — {what}"
        if h.via_hook:
            n = f" ({h.hook_count} hooks registered)" if h.hook_count else ""
            suggestions.insert(0, (
                f"A hook is registered again and again{n}: register it once, keep the handle "
                "that `register_forward_hook` returns and call `handle.remove()` when done; "
                "store `output.detach()` or a summary, not the output."
            ))
        elif h.via_traceback:
            suggestions.insert(0, (
                "A stored exception keeps its traceback, and every frame's locals (tensors "
                "included) stay alive: keep `str(exc)` or `traceback.format_exc()` instead, "
                "or drop the frames with `exc.with_traceback(None)`."
            ))
        elif h.container == "dict":
            suggestions.insert(0, (
                f"`{_short(h.path)}` is a cache without eviction: bound it "
                "(`functools.lru_cache(maxsize=...)`, an OrderedDict with eviction) or clear "
                "it every epoch."
            ))
        elif h.container in ("list", "deque", "set"):
            suggestions.insert(0, (
                f"`{_short(h.path)}` grows every step: bound it "
                "(`collections.deque(maxlen=N)`) or clear it at the epoch end"
                + (", and store Python numbers (`.item()`) rather than tensors."
                   if not group.grad_fn else ".")
            ))
        elif h.root == "frame":
            suggestions.insert(0, (
                "A long-lived frame (a generator or a running loop) keeps these tensors in a "
                "local variable; `del` it or rebind it each step."
            ))
    if not suggestions:
        suggestions.append(
            "Find where tensors of this shape are created and kept; `memwatch inspect` on a "
            "bundle lists the largest groups with their holders."
        )
    return culprit, suggestions, detail


def _site_culprit(a: Attribution) -> tuple[str, list[str], str]:
    """The allocation site that grew most (tracemalloc), when no holder of tensors was named."""
    site = a.site
    summ = a.tracemalloc_summary or {}
    steps = int(summ.get("steps") or 0)
    where = site.describe_where()
    culprit = (f"{where} — +{fmt_bytes(site.bytes_delta)} over the epoch, "
               f"{site.count_delta:,} new blocks (allocated here, still alive)")
    c, h = a.container, a.holder
    if h is not None and c is not None:  # who holds it, and where it was allocated
        culprit = f"{h.describe(c.len_delta)}, allocated at {culprit}"
    per_step = f" ({fmt_bytes(site.bytes_delta / steps)} per step)" if steps else ""
    detail = (f"tracemalloc: Python allocations made at {site.where} and still alive grew by "
              f"{fmt_bytes(site.bytes_delta)}{per_step} between the last two epoch ends")
    if site.code:
        detail += f" (`{site.code}`)"
    traced = summ.get("traced_net_bytes")
    rss = summ.get("rss_growth_bytes")
    if traced is not None and rss:
        detail += (f"; all traced Python allocations grew by {fmt_bytes(traced)} while RSS grew "
                   f"by {fmt_bytes(rss)}")
        overhead = summ.get("tracemalloc_overhead_rss_bytes") or 0
        if overhead > 0:
            detail += (f" (about {fmt_bytes(overhead)} of it tracemalloc's own bookkeeping, a "
                       "trace per live block)")
    detail += "."
    suggestions = site_suggestions(site, int(summ.get("frames") or 0))
    g = a.group
    if g is not None:
        detail += f" Live tensors grew too: +{g.count_delta} × {g.group.describe()}."
        if g.group.grad_fn:
            suggestions.append(
                "Keep numbers, not graphs: store `loss.item()` (a Python float) or "
                "`loss.detach()` instead of the tensor."
            )
    return culprit, suggestions, detail


_APPEND_RE = re.compile(r"^\s*(?:self\.)?(?P<name>[\w.]+?(?:\[[^\]]*\])*)\s*\."
                        r"(?P<op>append|extend|insert|appendleft|extendleft|add)\(")
_STORE_RE = re.compile(r"^\s*(?P<name>[\w.]+)\s*\[[^=]*\]\s*=(?!=)|"
                       r"^\s*(?P<name2>[\w.]+)\s*\.(?:setdefault|update)\(")
_CONCAT_RE = re.compile(r"^\s*(?P<name>[\w.]+(?:\[[^\]]*\])*)\s*\+=")


def site_suggestions(site: Any, frames: int = 0) -> list[str]:
    """What to do about the objects allocated at one site, from the line of source code."""
    where = site.where
    code = site.code or ""
    if not site.user:
        more = f" (tracemalloc={frames * 2} or more)" if frames else ""
        return [
            f"The allocation happens inside {where}, with no frame of your code among the frames "
            f"kept: trace more frames{more} to see which of your lines calls it, or look at the "
            "traceback in evidence['tracemalloc'].",
        ]
    m = _APPEND_RE.match(code)
    if m:
        name = m.group("name")
        kind = "set" if m.group("op") == "add" else "list"
        return [
            f"`{name}` gains objects every step ({where}) and nothing removes them: bound it "
            f"(`collections.deque(maxlen=N)`{' for a list' if kind == 'list' else ''}), clear "
            "it at the epoch end, or keep a running summary (a sum, a mean) instead of every "
            "record.",
        ]
    m = _STORE_RE.match(code)
    if m:
        name = m.group("name") or m.group("name2")
        return [
            f"`{name}` is a cache without eviction ({where}): bound it "
            "(`functools.lru_cache(maxsize=...)`, an OrderedDict that drops its oldest entry) "
            "or clear it every epoch.",
        ]
    m = _CONCAT_RE.match(code)
    if m:
        name = m.group("name")
        return [
            f"`{name}` grows by concatenation every step ({where}): write the lines to a file "
            "or a `logging` handler as they come, or keep only the last N "
            "(`collections.deque(maxlen=N)`).",
        ]
    return [
        f"Objects allocated at {where} stay alive: find what keeps them (the traceback in "
        "evidence['tracemalloc'] shows the call path; `gc.get_referrers` on one of them names "
        "its container) and bound or clear that container.",
    ]


def _short(path: str) -> str:
    """The name a person would grep for: `history` in ``train.history``.

    Example::

        >>> _short("train.history"), _short("['kept'][36]"), _short("f() (x.py:3): local m.logs")
        ('history', 'kept', 'm.logs')
    """
    if ": local " in path:
        return path.split(": local ", 1)[1].split("[", 1)[0].strip()
    head = path.split(" → ")[0]
    head = head.rsplit(".", 1)[-1] if "[" not in head else head
    whole = head
    while head.endswith("]") and "[" in head:
        head = head[: head.rindex("[")]
    if not head:  # no owner named ("['kept'][36]", a class attribute): the first key is the name
        key = whole[1:].split("]", 1)[0].strip("'\"") if whole.startswith("[") else ""
        return key if key and not key.isdigit() else whole
    return head.rsplit(".", 1)[-1] if "." in head else head


def worker_leak(origin: Origin, metric: str, stats: list[EpochStats], slope: float,
                workers: int, steps_to_oom: float | None, severity: Severity, *,
                limit: float | None = None, remaining: float = math.inf,
                run_known: bool = False) -> Finding:
    cur = stats[-1]
    seconds = None if steps_to_oom is None else steps_to_oom * cur.seconds_per_step
    msg = (
        f"{_where(metric)} grows by {fmt_bytes(slope)} per step {_span(stats)} "
        f"({workers} workers, floor {fmt_bytes(stats[0].floor)} → {fmt_bytes(cur.floor)}), and "
        "resident memory grows with it: each worker accumulates its own state (a per-worker "
        "cache in the Dataset, growing lists in __getitem__), which copy-on-write does not "
        "explain."
    ) + forecast_words(limit, steps_to_oom, seconds, severity, remaining, run_known)
    return origin.finding(
        kind="leak", metric=metric, severity=severity, message=msg, bytes_per_step=slope,
        steps_to_oom=steps_to_oom, seconds_to_oom=seconds,
        culprit=f"DataLoader worker processes ({workers}): per-worker growth in the Dataset",
        suggestions=[
            "Bound any cache your Dataset fills in `__getitem__` (it exists once per worker), "
            "or move it to shared storage (a numpy memmap, an Arrow table).",
            "With `persistent_workers=False` workers restart every epoch, which caps the "
            "growth at one epoch's worth.",
        ],
        evidence={"pattern": "per_worker_growth", "workers": workers,
                  "epoch_floors": [s.floor for s in stats[-6:]],
                  "mann_kendall_p": cur.trend.p},
    )


def worker_cow(origin: Origin, metric: str, cur: EpochStats, rss: EpochStats | None,
               workers: int, copied: float) -> Finding:
    msg = (
        f"{_where(metric)} rose by {fmt_bytes(copied)} while their resident "
        "memory stayed flat: that is copy-on-write, not a leak. Forked workers share the "
        "parent's pages until they touch them, and Python touches every object it reads "
        "(reference counts), so shared pages become private one by one (pytorch#13246). It "
        "stops when every page has been copied; summed RSS counts shared pages once per worker "
        "and overstates it, USS/PSS are the honest numbers."
    )
    return origin.finding(
        kind="plateau", metric=metric, severity="info", message=msg,
        culprit=f"copy-on-write of the Dataset's Python objects in {workers} workers",
        suggestions=[
            "Keep the dataset in numpy arrays, a memmap or Arrow instead of lists/dicts of "
            "Python objects: their pages are never written, so they stay shared.",
        ],
        evidence={"pattern": "copy_on_write", "workers": workers, "uss_rise": copied,
                  "rss_rise": rss.rise if rss is not None else None},
    )


# --------------------------------------------------------------------------- benign shapes

def accumulation(origin: Origin, metric: str, cur: EpochStats,
                 prev: EpochStats | None) -> Finding:
    base = prev.floor if prev is not None else cur.lo_start
    msg = (
        f"{_where(metric)} grows within each epoch (by about {fmt_bytes(cur.growth)}, "
        f"{fmt_bytes(cur.slope)} per step) and is released at the epoch end: the floor returned "
        f"to {fmt_bytes(base)}. This is epoch-scoped accumulation (outputs or metrics gathered "
        "for the epoch), not a leak — but the peak grows with the epoch length."
    )
    return origin.finding(kind="accumulation", metric=metric, severity="info", message=msg,
                          bytes_per_step=cur.slope,
                          suggestions=["If epochs get longer, reduce what is gathered per step "
                                       "(`.item()`, `.cpu()`, running sums instead of lists)."],
                          evidence={"epoch_rise": cur.rise, "floor": cur.floor,
                                    "peak": cur.peak})


def _benign(origin: Origin, kind: str, metric: str, message: str, **evidence: Any) -> Finding:
    """A shape that is not a leak: informational, with the figures it was judged on."""
    return origin.finding(kind=kind, metric=metric, severity="info", message=message,
                          evidence=evidence)


def plateau(origin: Origin, metric: str, cur: EpochStats) -> Finding:
    late_rate = f"{cur.saturation:.0%} of the early rate"
    return _benign(origin, "plateau", metric, (
        f"{_where(metric)} grew by {fmt_bytes(max(cur.rise, 0))} and levelled off (the late "
        f"half rises at {late_rate}): a warm-up, a bounded cache filling or allocator pools "
        "settling. Not a leak."), saturation_ratio=cur.saturation, rise=cur.rise, floor=cur.floor)


def step_change(origin: Origin, metric: str, cur: EpochStats) -> Finding:
    return _benign(origin, "step_change", metric, (
        f"{_where(metric)} jumped once by {fmt_bytes(cur.step_height)} around step "
        f"{cur.step_at} and stayed flat before and after: a buffer allocated once (optimizer "
        "state, a cache sized at first use). Not a leak unless it repeats."),
        height=cur.step_height, at_step=cur.step_at)


# --------------------------------------------------------------------------- allocator

def allocator_retention(origin: Origin, metric: str, slope: float, a: Attribution) -> Finding:
    msg = (
        f"{_where(metric)} grows by {fmt_bytes(slope)} per step, but live tensors and Python "
        f"objects do not (they explain {fmt_bytes(a.explained_bytes or 0)} of "
        f"{fmt_bytes(a.rss_growth_bytes or 0)}). Most often that is the C allocator "
        "keeping freed memory (glibc arenas fragment under many threads and mixed sizes), which "
        "no code fix addresses; less often native code (an extension) leaking outside Python."
    )
    summ = a.tracemalloc_summary
    if summ is not None:
        msg += (f" tracemalloc agrees: live traced Python allocations changed by "
                f"{fmt_bytes(summ.get('traced_net_bytes'))} over the last epoch.")
    return origin.finding(
        # Not a leak in the user's code: informational, like every non-leak finding.
        kind="allocator_retention", metric=metric, severity="info", message=msg,
        bytes_per_step=slope,
        suggestions=[
            "Limit glibc arenas: `MALLOC_ARENA_MAX=2` in the environment.",
            "Return free memory to the OS at epoch ends: "
            "`ctypes.CDLL('libc.so.6').malloc_trim(0)`.",
            "Use jemalloc or tcmalloc (`LD_PRELOAD=libjemalloc.so.2`), which fragment less.",
        ],
        evidence={"pattern": "allocator_retention", **a.evidence()},
    )


def fragmentation(origin: Origin, *, gap_now: float, gap_rise: float, slope: float,
                  split: float, retries: float, reserved: float, total: float) -> Finding:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get(
        "PYTORCH_ALLOC_CONF", "")
    severity: Severity = "warning" if retries > 0 or gap_now > 0.25 * total else "info"
    msg = (
        f"The caching allocator holds {fmt_bytes(gap_now)} reserved but unallocated "
        f"(it grew by {fmt_bytes(gap_rise)} this epoch) while allocated memory did not grow: "
        "fragmentation."
    )
    if split > 0:
        msg += f" {fmt_bytes(split)} sit in split blocks that cannot serve larger requests."
    if retries > 0:
        msg += (f" The allocator had to free its cache and retry {int(retries)} time(s) this "
                "epoch, which stalls the step each time.")
    sugg = []
    if "expandable_segments:True" not in conf:
        sugg.append("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (before CUDA "
                    "initialises): segments grow in place instead of fragmenting.")
    sugg += [
        "Keep tensor shapes stable between steps (pad variable-length batches to a few bucket "
        "sizes); changing shapes splinter the cache.",
        "If phases alternate (train/eval), `torch.cuda.empty_cache()` between them returns "
        "unused segments.",
    ]
    return origin.finding(kind="fragmentation", metric="device.reserved", severity=severity,
                          message=msg, bytes_per_step=slope, suggestions=sugg,
                          evidence={"reserved_minus_allocated": gap_now, "rise": gap_rise,
                                    "inactive_split_bytes": split, "alloc_retries": retries,
                                    "reserved": reserved, "total": total,
                                    "alloc_conf": conf or None})


def near_oom(origin: Origin, metric: str, peak: float, limit: float, margin: float) -> Finding:
    share = peak / limit if limit else 0.0
    severity: Severity = "critical" if share >= 0.98 else "warning"
    msg = (
        f"{_where(metric)} peaked at {fmt_bytes(peak)}, {share:.0%} of the {fmt_bytes(limit)} "
        f"limit (within the {margin:.0%} margin): the next larger batch, longer sequence or "
        "evaluation pass may not fit."
    )
    return origin.finding(kind="near_oom", metric=metric, severity=severity, message=msg,
                          suggestions=["Lower the batch size or enable activation "
                                       "checkpointing; check the per-step peak (device.peak) "
                                       "rather than the average."],
                          evidence={"peak": peak, "limit": limit, "share": share})
