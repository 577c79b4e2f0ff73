"""Reading what someone else may have written: JSON with a depth cap, strings made printable.

A bundle, a black-box record or an export can come from another user, a colleague or a bug
report. Its JSON is parsed with a nesting cap (100,000 nested brackets would otherwise end in a
``RecursionError``), bytes that are not UTF-8 are an error rather than a traceback, and numbers
come out finite and representable: ``NaN``, ``Infinity`` and a literal beyond the double range
(``1e999``) read as ``null`` (a missing reading, as memwatch itself writes one), and an integer
beyond 64 bits (401 digits: no memory figure, step or pid is that large, and ``float()`` of it
raises ``OverflowError``) refuses the document. Every string is cut to a length cap and
stripped of terminal control characters (an escape sequence in a finding's message could
retitle or clear the terminal of whoever runs ``memwatch inspect``) and of lone surrogates
(``"\\udcff"`` is valid JSON, but no UTF-8 terminal or HTML file can hold it).
:func:`number` is the one test of "a finite number" every reader applies to a value it
computes with.

Example::

    >>> from memwatch.core.untrusted import loads_json, number, printable, sanitize
    >>> printable("red \\x1b[31mtext\\x07 \\udcff")
    'red ?[31mtext? ?'
    >>> loads_json(b"[" * 100 + b"]" * 100, "x.json")
    Traceback (most recent call last):
    ...
    ValueError: x.json: JSON nested deeper than 64 levels
    >>> loads_json(b'{"a": NaN, "b": 1e999, "c": 2}', "x.json")
    {'a': None, 'b': None, 'c': 2}
    >>> loads_json(b'{"t": ' + b"9" * 401 + b'}', "x.json")
    Traceback (most recent call last):
    ...
    ValueError: x.json: an integer of 401 digits (beyond 64 bits: not a figure memwatch writes)
    >>> number(10 ** 400), number(float("inf")), number("3"), number(True), number(2.5)
    (None, None, None, None, 2.5)
    >>> sanitize({"m": "a" * 10}, max_str=4)
    {'m': 'aaaa...(cut)'}
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT", "MAX_STR", "check_depth", "loads_json", "number", "printable",
           "sanitize"]

#: Deepest nesting accepted in a document memwatch reads (its own are a few levels deep).
MAX_DEPTH = 64
#: Longest string kept from a document (longer ones are cut, saying so).
MAX_STR = 64 * 1024
#: Largest integer magnitude a document may hold (byte counts, steps and pids fit in 64 bits).
MAX_INT = 1 << 64

# C0 controls but newline and tab, DEL, C1 controls, the bidirectional overrides that can make a
# line read differently from what it holds, and lone surrogates (no UTF-8 output can hold them).
_UNPRINTABLE = {c: "?" for c in (*range(0, 9), *range(11, 32), *range(0x7F, 0xA0),
                                 *range(0x202A, 0x202F), *range(0x2066, 0x206A),
                                 *range(0xD800, 0xE000))}
_CUT = "...(cut)"


def printable(text: str) -> str:
    """``text`` with terminal control characters (escape, bell, carriage return, C1, bidi
    overrides) and lone surrogates replaced by ``?``; newlines and tabs are kept."""
    return text.translate(_UNPRINTABLE)


def number(v: Any) -> float | None:
    """``v`` as a finite float, or None when it is not a number (a string, a bool, null), not
    finite, or an integer too large for a float."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


class _TooBig(ValueError):
    pass


def _parse_int(text: str) -> int:
    # 2**64 has 20 digits: longer text is refused before int() (which is quadratic past a few
    # thousand digits, and refuses 4,300).
    if len(text) > 21 or abs(v := int(text)) > MAX_INT:
        raise _TooBig(f"an integer of {len(text.lstrip('-'))} digits (beyond 64 bits: not a "
                      "figure memwatch writes)")
    return v


def _parse_float(text: str) -> float | None:
    v = float(text)
    return v if math.isfinite(v) else None  # 1e999: beyond the double range


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


def _none(_constant: str) -> None:
    return None


def loads_json(data: bytes | str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON from a file named ``what``; ``ValueError`` with one line saying what is wrong
    (not UTF-8, not JSON, nested too deep, an integer beyond 64 bits). Non-finite numbers come
    out as None."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{what}: not UTF-8 text (byte {e.start})") from None
    else:
        text = data
    try:
        # NaN / Infinity (Python's json writes them; memwatch writes null): a missing reading.
        doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                         parse_constant=_none)
    except RecursionError:
        raise ValueError(f"{what}: JSON nested deeper than {max_depth} levels") from None
    except _TooBig as e:
        raise ValueError(f"{what}: {e}") from None
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
