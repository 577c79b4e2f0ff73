"""How a culprit reads: from an attribution (what grew, who holds it, where it was allocated) to
the finding's ``culprit`` line, suggestions specific to that culprit, and a sentence of detail.

Pure functions of :class:`~memwatch.analysis.evidence.Attribution` values: the rules
call :func:`culprit_of`; nothing here walks the heap.
"""

from __future__ import annotations

import re
from typing import Any

from memwatch.analysis.evidence import Attribution
from memwatch.core.units import fmt_bytes

__all__ = ["container_culprit", "culprit_of", "graph_culprit", "site_suggestions"]

_GRAPH_FIX = ("Keep numbers, not graphs: accumulate `loss.item()` (a Python float) or "
              "`loss.detach()`, e.g. `total += loss.item()`; a metric meter fed tensors needs "
              "`.item()` at the call site.")


def _name(a: Attribution) -> str:
    """The name a person would grep for: the growing container's own (``kept_arrays`` in
    ``train.kept_arrays``, ``processor.last_step_result``), never the route to it."""
    h = a.holder
    if h is None:
        return "the container"
    if h.name:
        return f"`{h.name}`"
    return f"`{_short(h.path)}`"


def since(a: Attribution) -> str:
    """What the census pair spans, in words: "since the last check", or, when the previous
    census was taken before the unit judged began (checks in between took none: within the
    cost budget only a verdict or steady growth takes one), "since step N"."""
    at, start = a.census_at_steps, a.unit_from_step
    if at and len(at) == 2 and start is not None and at[0] < start - max(2, start // 50):
        return f"since step {at[0]:,}"
    return "since the last check"


def _grows(a: Attribution, delta: int | None) -> str:
    """"grows every step" when the holder gained about an item a step, else how much."""
    if delta is not None and a.census_steps and delta >= 0.5 * a.census_steps:
        return "grows every step"
    return f"keeps growing (+{delta} {since(a)})" if delta else "keeps growing"


def _bounded(a: Attribution) -> str | None:
    """The fix for a holder that carries its own bound (never "bound it": it is): what it
    holds when full is what has to fit."""
    h = a.holder
    if h is None or h.bound is None:
        return None
    b = h.bound
    full = (f"{_name(a)} is already bounded (`{b.describe()}`, {b.length:,} of {b.capacity:,} "
            "items): it stops growing when full, but what it holds then does not fit. ")
    if b.kind == "lru_cache":  # a functools cache: clearing it and its key are fixes too
        return full + (f"Lower its `maxsize`, call `{_name(a).strip('`')}.cache_clear()` "
                       f"{_clear(a)}, or key it on what really repeats (a model object or a "
                       "step counter as an argument makes every call a new entry).")
    return full + ("Lower its bound, or keep less per item (a Python number with `.item()`, "
                   "`.cpu()`, a copy of the part you need).")


def _clear(a: Attribution) -> str:
    """When to clear it: at epoch ends for a run that has them, else every few checks."""
    return "at the epoch end" if a.epochs else "regularly (say at every check)"


def container_culprit(a: Attribution) -> tuple[str, list[str], str]:
    c = a.container
    assert c is not None
    h = a.holder
    what = f"+{fmt_bytes(c.bytes_delta)} {since(a)}"
    if h is not None:
        culprit = f"{h.describe(c.len_delta, since(a))} — {what}"
    else:
        culprit = (f"a {c.kind} of {c.length} {c.element or 'items'} "
                   f"(+{c.len_delta} {since(a)}) — {what}")
        if a.holder_note:
            culprit += f" (no holder named: {a.holder_note})"
    per = c.bytes_delta / max(c.len_delta, 1)
    detail = (f"The {c.kind} gained {c.len_delta} {c.element or 'items'} {since(a)}, "
              f"about {fmt_bytes(per)} each (weighed at the census: arrays by their buffers, "
              "strings and bytes by their size, containers and attributes followed).")
    name = _name(a)
    suggestions = []
    if c.graph_nodes > 0:
        detail += (f" They keep their autograd graphs: {c.graph_nodes} nodes added "
                   f"{since(a)}.")
        suggestions.append(_GRAPH_FIX)
    if (fix := _bounded(a)) is not None:
        suggestions.append(fix)
    elif h is not None and h.container == "lru_cache":
        suggestions.append(_cache_fix(name, a))
    elif c.kind == "dict":
        suggestions.append(
            f"{name} is a cache or log without eviction: bound it (`functools.lru_cache("
            "maxsize=...)`, an OrderedDict that drops its oldest entry) or clear it "
            f"{_clear(a)}.")
    else:
        suggestions.append(
            f"{name} {_grows(a, c.len_delta)}: bound it (`collections.deque(maxlen=N)`), clear "
            f"it {_clear(a)}, or write what it collects to disk as you go.")
    if c.element in ("numpy arrays", "tensors"):
        suggestions.append(
            "Keep what you need from each step (a metric, a float), not the whole array: "
            "per-step predictions kept for a run add up to gigabytes.")
    elif c.element in ("strings", "bytes objects", "dicts"):
        suggestions.append(
            "Per-step logs kept in memory grow with the run: send them to a logger or a file "
            "(the `logging` module, your experiment tracker) instead of a Python container.")
    return culprit, suggestions, detail


def graph_culprit(a: Attribution) -> tuple[str, list[str], str]:
    g = a.group
    assert g is not None
    h = a.holder
    total = f", {a.graph_nodes_named:,} nodes now" if a.graph_nodes_named else ""
    grew = (f"its autograd graph grew by {g.graph_nodes_delta:,} nodes "
            f"(about {fmt_bytes(max(g.graph_bytes_delta, 0))}) {since(a)}{total}")
    culprit = f"{h.shown} — {g.group.describe()}: {grew}" if h is not None else \
        f"a {g.group.describe()} tensor: {grew}"
    detail = ("Every step chains its graph onto this tensor, as a running sum kept with its "
              "history does (`total += loss`): `backward()` freed the saved activations but not "
              "the graph's nodes, which stay reachable from the sum through `grad_fn`.")
    return culprit, [_GRAPH_FIX], detail


def culprit_of(metric: str, a: Attribution) -> tuple[str | None, list[str], str]:
    """(culprit, suggestions, detail) of a leak of ``metric`` from its attribution: the
    growing container, tensor group, autograd graph or allocation site, who holds it, and
    fixes specific to that culprit."""
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
                "growth is suspected and it is cheap).",
            ], "")
        return (None, [
            "No growing group of live tensors was found between the last two censuses: the "
            "memory is held outside Python-visible tensors (native code, the allocator); "
            "`mw.dump(\"why\")` writes a bundle with the allocator's state now, for "
            "`memwatch inspect`.",
        ], "")
    group = g.group
    what = f"+{g.count_delta} × {group.describe()}"
    if group.views and g.bytes_delta > 0:
        what += (f", views that keep their bases' storage alive (+{fmt_bytes(g.bytes_delta)}"
                 f" {since(a)})")
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
        saved = a.graph_saved_bytes
        nodes = g.graph_nodes_delta
        if saved > 0:
            per = (f" (they keep their autograd graphs: {nodes:,} nodes and about "
                   f"{fmt_bytes(saved)} of saved tensors, {fmt_bytes(graph)} in all)")
            detail = (f"The growing tensors have grad_fn={group.grad_fn}: every one held keeps "
                      "its whole autograd graph alive, saved activations included (the "
                      "graphs' backward() has not run).")
        elif graph > 0:
            per = (f" (they keep their autograd graphs' nodes: {nodes:,} nodes, about "
                   f"{fmt_bytes(graph)}; backward() already freed their saved tensors)")
            detail = (f"The growing tensors have grad_fn={group.grad_fn}: every one held keeps "
                      "the nodes of its autograd graph alive; their saved activations were "
                      "freed by backward() and are not counted.")
        else:
            per = " (each keeps its autograd graph)"
            detail = (f"The growing tensors have grad_fn={group.grad_fn}: every one held keeps "
                      "its autograd graph alive.")
        what += per
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
        delta = h.owner_delta if h.owner_delta is not None else \
            g.count_delta if h.container else None
        culprit = f"{h.describe(delta)} — {what}"
        if h.via_hook:
            n = f" ({h.hook_count} hooks registered)" if h.hook_count else ""
            suggestions.insert(0, (
                f"A hook is registered again and again{n}: register it once, keep the handle "
                "that `register_forward_hook` returns and call `handle.remove()` when done; "
                "store `output.detach()` or a summary, not the output."
            ))
        elif (fix := _bounded(a)) is not None:
            suggestions.insert(0, fix)
        elif h.via_traceback:
            suggestions.insert(0, (
                "A stored exception keeps its traceback, and every frame's locals (tensors "
                "included) stay alive: keep `str(exc)` or `traceback.format_exc()` instead, "
                "or drop the frames with `exc.with_traceback(None)`."
            ))
        elif h.container == "lru_cache":
            suggestions.insert(0, _cache_fix(_name(a), a))
        elif h.container == "dict":
            suggestions.insert(0, (
                f"{_name(a)} is a cache without eviction: bound it "
                "(`functools.lru_cache(maxsize=...)`, an OrderedDict with eviction) or clear "
                f"it {_clear(a)}."
            ))
        elif h.container in ("list", "deque", "set"):
            delta = h.owner_delta if h.owner_delta is not None else g.count_delta
            suggestions.insert(0, (
                f"{_name(a)} {_grows(a, delta)}: bound it "
                f"(`collections.deque(maxlen=N)`) or clear it {_clear(a)}"
                + (", and keep the numbers you need (a metric), not the arrays."
                   if h.elements == "numpy arrays" else
                   ", and store Python numbers (`.item()`) rather than tensors."
                   if not group.grad_fn else ".")
            ))
        elif h.root == "frame":
            suggestions.insert(0, (
                "A long-lived frame (a generator or a running loop) keeps these tensors in a "
                "local variable; `del` it or rebind it each step."
            ))
    if h is None and a.holder_note:
        # A shape alone: say why no holder was named.
        culprit = f"{what} (no holder named: {a.holder_note})"
    if not suggestions:
        suggestions.append(
            "Find where tensors of this shape are created and kept: `gc.get_referrers(t)` on "
            "one of them lists what refers to it, or keep them from the start with a "
            "`weakref` and see which code still holds them."
        )
    return culprit, suggestions, detail


def _cache_fix(name: str, a: Attribution) -> str:
    """A functools cache that keeps every result: bound it, clear it, or key it on less."""
    h = a.holder
    entries = f" ({h.container_len} entries)" if h is not None and h.container_len else ""
    return (f"{name} is a functools cache{entries} that keeps every result it returned: give "
            "it a bound (`@functools.lru_cache(maxsize=N)`), call "
            f"`{name.strip('`')}.cache_clear()` {_clear(a)}, or key it on what really "
            "repeats (a model object or a step counter as an argument makes every call a new "
            "entry).")


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
    if (fix := _bounded(a)) is not None:  # never ask for the bound it has
        suggestions = [fix, *(t for t in suggestions if "maxlen" not in t
                              and "lru_cache" not in t)]
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
