"""Reading what someone else may have written: JSON with a depth cap, strings made printable.

A bundle or a black-box record can come from another user, a colleague or a bug report. Its
JSON is parsed with a nesting cap (100,000 nested brackets would otherwise end in a
``RecursionError``), bytes that are not UTF-8 are an error rather than a traceback, and every
string is cut to a length cap and stripped of terminal control characters (an escape sequence in
a finding's message could retitle or clear the terminal of whoever runs ``memwatch inspect``).

Example::

    >>> from memwatch.core.untrusted import loads_json, printable, sanitize
    >>> printable("red \\x1b[31mtext\\x07")
    'red ?[31mtext?'
    >>> loads_json(b"[" * 100 + b"]" * 100, "x.json")
    Traceback (most recent call last):
    ...
    ValueError: x.json: JSON nested deeper than 64 levels
    >>> sanitize({"m": "a" * 10}, max_str=4)
    {'m': 'aaaa...(cut)'}
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_STR", "check_depth", "loads_json", "printable", "sanitize"]

#: Deepest nesting accepted in a document memwatch reads (its own are a few levels deep).
MAX_DEPTH = 64
#: Longest string kept from a document (longer ones are cut, saying so).
MAX_STR = 64 * 1024

# C0 controls but newline and tab, DEL, C1 controls, and the bidirectional overrides that can
# make a line read differently from what it holds.
_UNPRINTABLE = {c: "?" for c in (*range(0, 9), *range(11, 32), *range(0x7F, 0xA0),
                                 *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
_CUT = "...(cut)"


def printable(text: str) -> str:
    """``text`` with terminal control characters (escape, bell, carriage return, C1, bidi
    overrides) replaced by ``?``; newlines and tabs are kept."""
    return text.translate(_UNPRINTABLE)


def check_depth(obj: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (parsed JSON) nests no deeper than ``max_depth`` (iterative: no
    recursion on a hostile document)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            items: Any = o.values()
        elif isinstance(o, list):
            items = o
        else:
            continue
        if d >= max_depth:
            return False
        stack.extend((v, d + 1) for v in items if isinstance(v, (dict, list)))
    return True


def loads_json(data: bytes | str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON from a file named ``what``; ``ValueError`` with one line saying what is wrong
    (not UTF-8, not JSON, nested too deep)."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{what}: not UTF-8 text (byte {e.start})") from None
    else:
        text = data
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError(f"{what}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise ValueError(f"{what}: not valid JSON ({e})") from None
    if not check_depth(doc, max_depth):
        raise ValueError(f"{what}: JSON nested deeper than {max_depth} levels")
    return doc


def _clean(s: str, max_str: int) -> str:
    if len(s) > max_str:
        s = s[:max_str] + _CUT
    return s.translate(_UNPRINTABLE)


def sanitize(obj: Any, max_str: int = MAX_STR, depth: int = 0) -> Any:
    """A copy of parsed JSON with every string (keys too) cut to ``max_str`` characters and made
    :func:`printable`. Nesting past :data:`MAX_DEPTH` becomes ``None`` (:func:`loads_json`
    refuses it before it gets here)."""
    if isinstance(obj, str):
        return _clean(obj, max_str)
    if depth > MAX_DEPTH:
        return None
    if isinstance(obj, dict):
        return {(_clean(k, max_str) if isinstance(k, str) else k): sanitize(v, max_str, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitize(v, max_str, depth + 1) for v in obj]
    return obj
