"""Telling the user about findings on the console, once each.

Two channels, chosen by what a finding means for the run:

* a :class:`memwatch.MemWatchWarning` for a finding of severity ``warning`` or ``critical`` (it
  can kill this run), once per (stage, kind, metric), and once more when a later verdict names
  the holder the first could not (the census needs two checks);
* a **notice** for a new leak verdict that is not warned about (severity ``info``: the forecast
  reaches no limit within the run): one line on the ``memwatch`` logger at level WARNING, once
  per (stage, kind, metric). A notice without a holder (the census that names it needs one more
  check) waits for the end of the next check of its kind and stage (the training's next epoch
  end for a verdict at a training epoch end: checks inside the epoch, and evaluation loops'
  checks, take no census for it): when that check names the
  holder of a leak of the same stage, its line is the only one; otherwise the waiting line is
  said then (or when the session closes). A leak that is no threat can wait one check, and it
  gets one line. With no logging configured, Python prints it on stderr as it is
  (``logging.lastResort``); ``logging.getLogger("memwatch").setLevel(logging.ERROR)`` hides it.
  A log record, not a warning: it never turns into an exception under ``-W error`` or pytest's
  warnings-as-errors, and severity keeps meaning "a threat to this run".

Every new leak verdict therefore reaches the console exactly once, whatever its severity; other
``info`` findings (a warm-up that levelled off) stay silent, so a clean run is quiet.

A verdict is a belief (:mod:`memwatch.analysis.beliefs`): when a later check changes a belief
whose earlier state was told (a leak whose growth stopped, a leak that turned out to fill a
bounded container, growth that resumed, which ranks leak), the change is told once, in one line
(its ``evidence["belief_change"]``); a change of a belief never told is not news (a notice that
waited for its holder and learned it is bounded is dropped unsaid).

The warning's first line is short (kind, metric, holder, rate, forecast; under ~160
characters); the verdict, the holder in full and each suggestion follow on lines of their own.
The warning points at the user's code: :func:`user_stacklevel` walks the stack to the first frame
outside memwatch and the frameworks it plugs into (the ``step()``, ``trainer.fit(...)`` or
``optimizer.step()`` line), whatever the call depth.

Example::

    >>> import warnings
    >>> from memwatch import Finding
    >>> from memwatch.runtime.warn import FindingWarner
    >>> w = FindingWarner()
    >>> f = Finding(kind="leak", metric="host.rss", severity="warning", message="grows.")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     w.tell([f])
    ...     w.tell([f])  # said already
    >>> [str(c.message) for c in caught]
    ['memwatch: leak in host.rss: grows.']
    >>> line = headline(Finding(kind="leak", metric="host.rss", severity="info", message="...",
    ...                         bytes_per_step=262144.0, steps_to_oom=90000.0,
    ...                         culprit="Tiny.kept — +150 × float32[65536] on cpu"))
    >>> line[:50]
    'memwatch: leak in host.rss, held by Tiny.kept: +25'
    >>> line[47:]
    '+256.0 KiB/step, not a threat to this run (the limit is ~90,000 steps away)'
"""

from __future__ import annotations

import logging
import math
import re
import sys
import textwrap
import warnings
import weakref
from collections.abc import Iterable
from types import FrameType

from memwatch.analysis.beliefs import state_of
from memwatch.core.errors import MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.core.units import fmt_bytes, fmt_duration

__all__ = ["NOTICE_KINDS", "WARN_SEVERITIES", "FindingWarner", "headline", "notice_text",
           "user_stacklevel", "warning_text"]

log = logging.getLogger("memwatch")

#: Findings at these severities are warned about (a :class:`MemWatchWarning`).
WARN_SEVERITIES = ("warning", "critical")
#: Kinds whose every new verdict reaches the console once, whatever its severity.
NOTICE_KINDS = ("leak", "rank_leak")
#: Packages whose frames stand between the user's call and memwatch's: a warning skips them.
FRAMEWORKS = frozenset({"torch", "lightning", "pytorch_lightning", "lightning_fabric",
                        "transformers", "accelerate"})
HEADLINE_MAX = 160
# The findings told so far by any warner of this process, weakly (an entry goes with its finding,
# so an id is never mistaken for a later object's).
_TOLD: weakref.WeakValueDictionary[int, Finding] = weakref.WeakValueDictionary()
_HOLDER_MAX = 60
_WIDTH = 100
_INDENT = "    "


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the *caller* of this function point at
    the user's code: the first frame outside memwatch and the training frameworks (the user's
    ``mw.step()``, ``trainer.fit(...)``, ``optimizer.step()``), else the first frame outside
    memwatch (a framework calling from a thread of its own). Walks the stack only when a warning
    is about to be given, so call depth inside memwatch never matters."""
    f: FrameType | None = sys._getframe(1)
    level, first_outside = 1, 0
    while f is not None:
        package = str(f.f_globals.get("__name__", "")).partition(".")[0]
        if package != "memwatch":
            first_outside = first_outside or level
            if package not in FRAMEWORKS:
                return level
        f, level = f.f_back, level + 1
    return first_outside or 1


def _holder(culprit: str | None, room: int = _HOLDER_MAX) -> str | None:
    """The holder's name from a culprit ("Tiny.kept[3] — +150 × float32[...]" -> "Tiny.kept[3]"),
    shortened to ``room`` characters from its start: a path ends with the container itself."""
    if not culprit:
        return None
    # (a container's description, "(list, 40 tuples, +40 since the last check)", stays below)
    name = re.sub(r" \([A-Za-z_][\w.]*, [^()]*\)", "", culprit.split(" — ", 1)[0]).strip()
    return name if len(name) <= room else "…" + name[len(name) - room + 1:]


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _forecast(f: Finding) -> str:
    if _finite(f.steps_to_oom):
        steps = f"~{f.steps_to_oom:,.0f} steps"
        if f.severity == "info":
            return f"not a threat to this run (the limit is {steps} away)"
        when = f" ({fmt_duration(f.seconds_to_oom)})" if _finite(f.seconds_to_oom) else ""
        return f"OOM in {steps}{when}"
    if f.severity == "info" and f.kind in NOTICE_KINDS:
        return "not a threat to this run"
    return ""


_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z])")


def _first_sentence(text: str) -> str:
    parts = _SENTENCE_END.split(text, maxsplit=1)
    return parts[0] + "." if len(parts) > 1 else text


def _facts(f: Finding) -> list[str]:
    facts = [f"+{fmt_bytes(f.bytes_per_step)}/step"] if _finite(f.bytes_per_step) and \
        f.bytes_per_step else []
    if forecast := _forecast(f):
        facts.append(forecast)
    return facts


def headline(f: Finding, labels: str = "") -> str:
    """One line under ~160 characters: kind, metric, holder, rate, forecast (or, for a finding
    without a rate, the first sentence of its message)."""
    text = f"memwatch{labels}: {f.kind} in {f.metric}"
    tail = ": " + (", ".join(_facts(f)) or _first_sentence(f.message))
    # The holder gets the room the rate and forecast leave (at least 24 characters).
    room = max(HEADLINE_MAX - len(text) - len(tail) - len(", held by "), 24)
    holder = _holder(f.culprit, min(room, _HOLDER_MAX))
    if holder:
        text += f", held by {holder}"
    text += tail
    return text if len(text) <= HEADLINE_MAX else text[:HEADLINE_MAX - 1] + "…"


def _block(text: str, first: str = "") -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=_INDENT + first,
                         subsequent_indent=_INDENT + " " * len(first),
                         break_on_hyphens=False) or [_INDENT + first]


def warning_text(f: Finding, labels: str = "") -> str:
    """The warning: the :func:`headline`, then the verdict, the holder in full and each
    suggestion on lines of their own (wrapped at 100 columns)."""
    lines = [headline(f, labels)]
    # (without a rate, the headline said the verdict's first sentence already)
    body = f.message if _facts(f) else f.message[len(_first_sentence(f.message)):].strip()
    if body:
        lines += _block(body)
    if f.culprit and f.culprit not in f.message:
        lines += _block(f.culprit, "held by: ")
    lines += [line for s in f.suggestions for line in _block(s, "- ")]
    return "\n".join(lines)


def notice_text(f: Finding, labels: str = "") -> str:
    """One line: the :func:`headline` and the first suggestion's first sentence (the fix)."""
    text = headline(f, labels)
    if f.suggestions:
        text += f". Fix: {_first_sentence(f.suggestions[0])}"
    return text


class FindingWarner:
    """Tells about each finding once: a :class:`MemWatchWarning` when it threatens the run, a
    one-line notice for a leak that does not (see the module doc)."""

    def __init__(self) -> None:
        #: What was said already: (stage, kind, metric), ``metric + "#culprit"`` once the holder
        #: was named, ``metric + "#notice"`` for a notice. Checkpointable as a list of lists.
        self.warned: set[tuple[str, str, str]] = set()
        #: Notices without a holder, waiting one check for a named one: stage -> (the finding,
        #: its labels, the kind of check it waits for, the checks of that kind ended since).
        self._waiting: dict[str, tuple[Finding, str, str, int]] = {}
        self._at = "epoch_end"
        #: Beliefs whose state was told (a change of them is news), by ``Finding.belief``.
        self.told: set[str] = set()

    def tell(self, findings: Iterable[Finding], labels: str = "", *, warn: bool = True,
             at: str = "epoch_end") -> None:
        """Each new finding, on the channel its severity calls for (``warn=False``: the threats
        too become notices, so a leak still reaches the console once). A finding that another
        warner told already (a session the user handed to an adapter tells its own) is not
        told again. ``at``: the kind of check that found them (``"epoch_end"``, ``"interval"``,
        ...)."""
        self._at = at
        for f in findings:
            if _TOLD.get(id(f)) is f:
                continue
            if f.belief is not None and self._revised(f, labels, warn):
                _TOLD[id(f)] = f
                continue
            if warn and f.severity in WARN_SEVERITIES:
                self.warn(f, labels)
            elif f.kind in NOTICE_KINDS:
                self.notice(f, labels)
            else:
                continue
            _TOLD[id(f)] = f

    def _revised(self, f: Finding, labels: str, warn: bool) -> bool:
        """``f`` changes a belief: said here when that belief's earlier state was told (True:
        done with ``f``); a waiting notice of a leak that is no longer one is dropped."""
        waited = self._waiting.get(f.stage)
        if waited is not None and waited[0].belief == f.belief and state_of(f) != "leak":
            del self._waiting[f.stage]  # never told, and no longer a leak: nothing to say
        change = f.evidence.get("belief_change")
        if not change or f.belief not in self.told:
            return False
        if warn and f.severity in WARN_SEVERITIES:
            warnings.warn(f"memwatch{labels}: {change}\n" + warning_text(f, labels),
                          MemWatchWarning, stacklevel=user_stacklevel())
        else:
            log.warning("memwatch%s: %s", labels, change)
        return True

    def _said(self, f: Finding) -> None:
        if f.belief is not None:
            self.told.add(f.belief)

    def warn(self, f: Finding, labels: str = "") -> None:
        self._said(f)
        key = (f.stage, f.kind, f.metric)
        named = (f.stage, f.kind, f.metric + "#culprit")
        if key in self.warned and (not f.culprit or named in self.warned):
            return
        self.warned.add(key)
        if f.culprit:
            self.warned.add(named)
        warnings.warn(warning_text(f, labels), MemWatchWarning, stacklevel=user_stacklevel())

    def notice(self, f: Finding, labels: str = "") -> None:
        key = (f.stage, f.kind, f.metric + "#notice")
        named = (f.stage, f.kind, f.metric + "#notice#culprit")
        if key in self.warned and (not f.culprit or named in self.warned):
            return
        if not f.culprit and f.kind == "leak":
            # said at the end of the next check of this kind, unless that one names the holder
            self._waiting.setdefault(f.stage, (f, labels, self._at, 0))
            return
        self._said(f)
        waited = self._waiting.pop(f.stage, None)
        if waited is not None and f.kind == "leak":
            # The holder of the stage's leak, named: this line replaces the waiting one.
            self.warned.add((f.stage, waited[0].kind, waited[0].metric + "#notice"))
        elif waited is not None:
            self._waiting[f.stage] = waited
        self.warned.add(key)
        if f.culprit:
            self.warned.add(named)
        log.warning("%s", notice_text(f, labels))

    def end_check(self, at: str = "epoch_end", stage: str = "train") -> None:
        """A check (of kind ``at``, of ``stage``'s session) had all its findings told: a notice
        of that stage that waited a whole check of its kind for its holder is said now."""
        for st, (f, labels, waits_for, checks) in list(self._waiting.items()):
            if waits_for != at or st != stage:
                continue
            if checks >= 1:
                self._say_waiting(st)
            else:
                self._waiting[st] = (f, labels, waits_for, checks + 1)

    def flush(self) -> None:
        """The session ends: every waiting notice is said."""
        for stage in list(self._waiting):
            self._say_waiting(stage)

    def _say_waiting(self, stage: str) -> None:
        f, labels, _, _ = self._waiting.pop(stage)
        self._said(f)
        self.warned.add((f.stage, f.kind, f.metric + "#notice"))
        log.warning("%s", notice_text(f, labels))
