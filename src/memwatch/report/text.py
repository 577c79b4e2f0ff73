"""Text for people: long messages shortened where a word ends, with an ellipsis.

An exception message cut at a fixed width ends mid-word (``Error code 12 (Cannot allocate me``)
and reads as a corrupted message; cut at a word boundary and marked with ``…`` it reads as what
it is, the start of a longer one.

Example::

    >>> from memwatch.report.text import shorten
    >>> shorten("Error code 12 (Cannot allocate memory)", 30)
    'Error code 12 (Cannot…'
    >>> shorten("short enough", 30)
    'short enough'
"""

from __future__ import annotations

__all__ = ["shorten"]

ELLIPSIS = "…"


def shorten(text: object, width: int = 160) -> str:
    """The first line of ``text`` in at most ``width`` characters: cut after the last whole word
    that fits (or mid-word when a single word fills more than half the width), then ``…``."""
    s = " ".join(str(text).strip().splitlines()[0].split()) if str(text).strip() else ""
    more = "\n" in str(text).strip()
    if len(s) <= width and not more:
        return s
    if len(s) <= width - 1:
        return s + ELLIPSIS
    cut = s[:width - 1]
    space = cut.rfind(" ")
    if s[width - 1] != " " and space > width // 2:  # drop the word that does not fit whole
        cut = cut[:space]
    return cut.rstrip(" ,;:-(") + ELLIPSIS
