"""JSON helpers shared by the file sinks: strict JSON (no NaN/Infinity), numpy-safe."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def finite(x: Any) -> Any:
    """``x`` with every non-finite float as ``None``, recursively through dicts, lists and
    tuples (JSON has no NaN or Infinity; a chart shows a gap)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def jsonable(x: Any, depth: int = 0) -> Any:
    """``x`` with NaN/inf as ``None``, numpy scalars and arrays as Python values, paths as text."""
    if depth > 12:
        return str(x)
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): jsonable(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in x]
    tolist = getattr(x, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return jsonable(tolist(), depth + 1)
    return str(x)
