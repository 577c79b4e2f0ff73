"""Culprits that are not a group of tensors: a growing container of Python objects, weighed, and
an autograd graph that grows onto one live tensor. Each returns (culprit, suggestions, detail)
for :func:`memwatch.analysis.explain.leak`."""

from __future__ import annotations

from memwatch.analysis.attribution import Attribution
from memwatch.core.units import fmt_bytes

__all__ = ["container_culprit", "graph_culprit"]

_GRAPH_FIX = ("Keep numbers, not graphs: accumulate `loss.item()` (a Python float) or "
              "`loss.detach()`, e.g. `total += loss.item()`; a metric meter fed tensors needs "
              "`.item()` at the call site.")


def _name(a: Attribution) -> str:
    """The last segment a person would grep for (``kept_arrays`` in ``train.kept_arrays``)."""
    h = a.holder
    if h is None:
        return "the container"
    path = h.path
    if ": local " in path:
        path = path.split(": local ", 1)[1]
    head = path.split(" → ")[0].split("[", 1)[0]
    return f"`{head.rsplit('.', 1)[-1] or head}`"


def container_culprit(a: Attribution) -> tuple[str, list[str], str]:
    c = a.container
    assert c is not None
    h = a.holder
    what = f"+{fmt_bytes(c.bytes_delta)} since the last check"
    if h is not None:
        culprit = f"{h.describe(c.len_delta)} — {what}"
    else:
        culprit = (f"a {c.kind} of {c.length} {c.element or 'items'} "
                   f"(+{c.len_delta} since the last check) — {what}")
    per = c.bytes_delta / max(c.len_delta, 1)
    detail = (f"The {c.kind} gained {c.len_delta} {c.element or 'items'} since the last check, "
              f"about {fmt_bytes(per)} each (weighed at the census: arrays by their buffers, "
              "strings and bytes by their size, containers and attributes followed).")
    name = _name(a)
    suggestions = []
    if c.graph_nodes > 0:
        detail += (f" They keep their autograd graphs: {c.graph_nodes} nodes added since the "
                   "last check.")
        suggestions.append(_GRAPH_FIX)
    if c.kind == "dict":
        suggestions.append(
            f"{name} is a cache or log without eviction: bound it (`functools.lru_cache("
            "maxsize=...)`, an OrderedDict that drops its oldest entry) or clear it every epoch.")
    else:
        suggestions.append(
            f"{name} grows every step: bound it (`collections.deque(maxlen=N)`), clear it at "
            "the epoch end, or write what it collects to disk as you go.")
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
    grew = (f"its autograd graph grew by {g.graph_nodes_delta} nodes "
            f"(about {fmt_bytes(max(g.graph_bytes_delta, 0))}) since the last check")
    culprit = f"{h.path} — {g.group.describe()}: {grew}" if h is not None else \
        f"a {g.group.describe()} tensor: {grew}"
    detail = ("Every step chains its graph onto this tensor, as a running sum kept with its "
              "history does (`total += loss`): `backward()` freed the saved activations but not "
              "the graph's nodes, which stay reachable from the sum through `grad_fn`.")
    return culprit, [_GRAPH_FIX], detail
