"""How holders read: ``module.name`` for a global, ``f() (file.py:12): local logs`` for a local of
a running function, element indices left out of names (the container is described instead)."""

from __future__ import annotations

import os
import re
import types
from typing import Any

from memwatch.analysis.culprits.census.ownership import module_file
from memwatch.analysis.culprits.growth.weigh import element_name

__all__ = ["elements_of", "is_index", "label_name", "local_label", "module_label", "short_name"]


def module_label(mod: types.ModuleType) -> str:
    """``module.name`` for a global: the module's import name, or for the script being run
    (``__main__``) its file's name without ``.py``."""
    name = str(getattr(mod, "__name__", "?"))
    f = module_file(mod)
    if name == "__main__" and f:
        return os.path.splitext(os.path.basename(str(f)))[0]
    return name


def local_label(f: types.FrameType, name: Any) -> str:
    """``train_sae() (train.py:198): local logs`` — the frame first, so keys read after it."""
    where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
    return f" → {f.f_code.co_name}() ({where}): local {name}"


def is_index(kind: str, label: str) -> bool:
    """A step into an element: a list/tuple/deque/set position, or a dict key that is not a
    string (a cache's key says nothing a person reads)."""
    if kind in ("list", "deque", "tuple", "set"):
        return True
    if kind in ("dict", "attr_dict"):
        key = label[label.index("[") + 1:-1] if "[" in label else ""
        return not (key.startswith("'") or key.startswith('"'))
    return False


def elements_of(c: Any) -> str | None:
    try:
        if isinstance(c, dict):
            for v in reversed(c.values()):
                return element_name(v)
        for v in c:
            return element_name(v)
    except Exception:  # noqa: BLE001 - mutated under us
        return None
    return None


_CALLED = re.compile(r"(?:closure variable `(?P<var>[^`]+)`|local (?P<local>[^\s\[.]+)|"
                     r"(?:cache|closure|default arguments) of (?P<fn>[\w.<>]+)\(\))")


def label_name(kind: str, label: str) -> str | None:
    """The name a person greps for in one hop's label: ``kept`` of ``.kept``, ``mod.kept`` and
    ``['kept']``, the variable of a closure or a local, the function of a cache; None for an
    index or a hop that names nothing.

    Example::

        >>> label_name("global", "train.EVAL_LOGITS"), label_name("attr_dict", ".cache")
        ('EVAL_LOGITS', 'cache')
        >>> label_name("closure", " → closure variable `rollout` of main.<locals>.train()")
        'rollout'
        >>> label_name("frame", " → run() (x.py:3): local hist"), label_name("list", "[3]")
        ('hist', None)
    """
    if kind == "module":
        return label or None
    if kind in ("global", "attr", "attr_dict"):
        head = label.split("[", 1)[0]
        return head.rsplit(".", 1)[-1] or None
    if kind == "dict" and label.startswith(("['", '["')):
        return label[2:].split("]", 1)[0].rstrip("'\"") or None
    m = _CALLED.search(label)
    if m is None:
        return None
    name = m.group("var") or m.group("local") or m.group("fn")
    return name.rsplit(".", 1)[-1] if m.group("fn") else name


def short_name(kinds: list[str], segments: list[str], at: int) -> str | None:
    """The name of the container a walk named at segment ``at`` (innermost first), with the
    variable or the model class that holds it when it is an attribute of one
    (``processor.last_step_result``, ``Net.kept``; never ``self.…``)."""
    if not 0 <= at < len(segments):
        return None
    name = label_name(kinds[at], segments[at])
    if name is None:
        return None
    if kinds[at] in ("attr", "attr_dict") and at + 1 < len(segments) and \
            kinds[at + 1] in ("global", "frame", "closure", "module"):
        parent = label_name(kinds[at + 1], segments[at + 1])
        if parent and parent != "self":
            return f"{parent}.{name}"
    return name
