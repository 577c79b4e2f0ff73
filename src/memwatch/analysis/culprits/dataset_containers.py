"""What a DataLoader worker's census reads: the containers its Dataset keeps, by name.

The Dataset's attributes, its class's, and the globals of its module (a user's
``_CACHE = {}``), and one level into attributes that are instances of the user's classes
(``self.reader.cache``): lists, dicts, sets, deques and functools caches, by length; and, for a
list of the user's objects, how many of them have each attribute set. Read in the worker by
:mod:`memwatch.analysis.culprits.worker_census` (lengths only: microseconds, and no page of
the worker's heap written).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from memwatch.analysis.culprits.census.containers import (
    CACHE_TYPE,
    CONTAINER_TYPES,
    cache_size,
)
from memwatch.analysis.culprits.census.ownership import is_user_module, is_user_type
from memwatch.analysis.culprits.holders.referrers import key_label, safe_dict

__all__ = ["MAX_ATTRS", "POPULATION_SAMPLE", "attribute_counts", "containers", "dataset_lengths",
           "vars_of"]

#: Containers one census reports (the longest first).
MAX_ATTRS = 32


def dataset_lengths(dataset: Any, refs: dict[str, tuple[Any, str]] | None = None
                    ) -> tuple[dict[str, tuple[int, str]], float]:
    """The length of every container the Dataset keeps (see :func:`containers`), by name,
    and the CPU milliseconds that took. A list of the user's objects (``ConcatDataset``'s
    datasets) is also counted by attribute: how many of them have each attribute set, as
    ``Element.attr`` of kind ``"attribute"`` (a ``cached_property`` that every dataset a worker
    reads fills in: eva#387). ``refs`` gets, per name, what to weigh its growth from."""
    t0 = time.thread_time()
    out: dict[str, tuple[int, str]] = {}
    for name, c, kind in containers(dataset):
        n = cache_size(c) if kind == "cache" else len(c)
        if n is None:
            continue
        out[name] = (n, kind)
        if refs is not None:
            refs[name] = (c, "")
        if kind == "list" and n >= 2 and is_user_type(type(c[0])):
            for attr, (count, tname) in attribute_counts(c).items():
                out[f"{tname}.{attr}"] = (count, "attribute")
                if refs is not None:
                    refs[f"{tname}.{attr}"] = (c, attr)
    return out, round((time.thread_time() - t0) * 1000.0, 3)


#: Elements of a list of the user's objects whose attributes are counted (an even sample).
POPULATION_SAMPLE = 256


def attribute_counts(items: list[Any]) -> dict[str, tuple[int, str]]:
    """How many of ``items`` (estimated from an even sample) have each instance attribute set,
    with their class's name."""
    stride = max(len(items) // POPULATION_SAMPLE, 1)
    counts: dict[str, int] = {}
    tname = type(items[0]).__name__
    for x in items[::stride][:POPULATION_SAMPLE]:
        for k in list(vars_of(x)):
            if isinstance(k, str) and not k.startswith("__"):
                counts[k] = counts.get(k, 0) + 1
    return {k: (n * stride, tname) for k, n in counts.items()}


def containers(dataset: Any) -> list[tuple[str, Any, str]]:
    """(name, container, kind) of what the Dataset keeps, at most :data:`MAX_ATTRS`."""
    out: list[tuple[str, Any, str]] = []
    cls = type(dataset)
    # (prefix, namespace, look one level into the user's instances in it)
    spaces: list[tuple[str, dict[str, Any], bool]] = [(cls.__name__, vars_of(dataset), True),
                                                      (cls.__name__, dict(vars(cls)), False)]
    mod = sys.modules.get(cls.__module__)
    if mod is not None and is_user_module(mod):
        spaces.append((cls.__module__.rsplit(".", 1)[-1], vars(mod), False))
    for prefix, ns, deeper in spaces:
        for k, v in list(ns.items()):
            if not isinstance(k, str) or k.startswith("__"):
                continue
            name = f"{prefix}.{key_label(k).strip(chr(39))}"
            kind = _kind(v)
            if kind is not None:
                out.append((name, v, kind))
            elif deeper and is_user_type(type(v)) and not isinstance(v, type):
                for k2, v2 in list(vars_of(v).items()):  # one level in: self.reader.cache
                    kind2 = _kind(v2)
                    if kind2 is not None and isinstance(k2, str):
                        out.append((f"{name}.{key_label(k2).strip(chr(39))}", v2, kind2))
    seen: set[int] = set()
    unique = []
    for n, c, k in out:
        if id(c) not in seen:
            seen.add(id(c))
            unique.append((n, c, k))
    return unique[:MAX_ATTRS]


def _kind(v: Any) -> str | None:
    if type(v) is CACHE_TYPE:
        return "cache"
    return CONTAINER_TYPES.get(type(v))


def vars_of(o: Any) -> dict[str, Any]:
    """``o.__dict__`` without ``__getattr__`` hooks (:func:`safe_dict`), or ``{}``."""
    d = safe_dict(o)
    return d if isinstance(d, dict) else {}
