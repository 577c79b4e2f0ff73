"""Byte formatting. GiB = 2**30, MiB = 2**20, KiB = 2**10 (binary units everywhere)."""

from __future__ import annotations

import math

from memwatch.core.untrusted import number

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def fmt_bytes(n: float | None) -> str:
    """Human-readable binary size: ``fmt_bytes(3 * 2**20) == '3.0 MiB'``."""
    v = number(n)  # also: a value read from someone's file that is no finite number
    if v is None:
        return "n/a"
    sign = "-" if v < 0 else ""
    v = abs(v)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if v >= size:
            return f"{sign}{v / size:.1f} {unit}"
    return f"{sign}{v:.0f} B"


def fmt_duration(seconds: float | None) -> str:
    """``fmt_duration(5400) == '1.5 h'``."""
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 365.25 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / (365.25 * 86400):,.0f} years"
