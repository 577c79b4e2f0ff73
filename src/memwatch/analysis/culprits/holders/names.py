"""How holders read: ``module.name`` for a global, ``f() (file.py:12): local logs`` for a local of
a running function, element indices left out of names (the container is described instead)."""

from __future__ import annotations

import os
import types
from typing import Any

from memwatch.analysis.culprits.growth.weigh import element_name

__all__ = ["elements_of", "is_index", "local_label", "module_label"]


def module_label(mod: types.ModuleType) -> str:
    """``module.name`` for a global: the module's import name, or for the script being run
    (``__main__``) its file's name without ``.py``."""
    name = str(getattr(mod, "__name__", "?"))
    f = getattr(mod, "__file__", None)
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
