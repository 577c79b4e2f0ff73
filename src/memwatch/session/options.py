"""The options of :class:`memwatch.MemWatch` as keyword arguments: their types for a type checker
(:class:`WatchOptions`), and their names checked at run time (:func:`check_names`).

:class:`memwatch.WatchConfig` is the one declaration of the options (their types, defaults,
checks, documentation and flags). A type checker needs the keyword types written out, so
``WatchOptions`` repeats its fields' names and types (and ``AdapterOptions`` those the adapters
pass on), so that ``MemWatch(chek_every_n_steps=500)`` is an error for mypy too; nothing else
may, and ``tests/session/test_options.py`` checks that they are the fields' own, name for name
and type for type. At run time a misspelled name raises :class:`memwatch.ConfigError` naming the
closest valid one.

Example::

    >>> from memwatch.session.options import check_names
    >>> check_names({"chek_every_n_steps": 500}, "MemWatch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memwatch.core.errors.ConfigError: MemWatch got ...; did you mean 'check_every_n_steps'? ...
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from memwatch.analysis.context import AnalyzerConfig
from memwatch.core.errors import ConfigError
from memwatch.runtime.dispatch import SinkSet

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover - annotations are never evaluated: only type checkers read Unpack
    Unpack = None

__all__ = ["AdapterOptions", "Unpack", "WatchOptions", "check_names", "option_names"]


class AdapterOptions(TypedDict, total=False):
    """The options an adapter passes on to its :class:`memwatch.MemWatch`: every option but
    ``log_every_n_steps`` and ``warn`` (``adapter=False`` in their declarations), which the
    adapters take as arguments of their own."""

    device: Any
    host: bool
    workers: bool
    out_dir: str | os.PathLike[str]
    interval_s: float | None
    capacity: int
    buckets_per_epoch: int
    total_steps: int | None
    analyze: bool
    census: str
    analyzer_config: AnalyzerConfig | None
    distributed: str
    exchange_timeout_s: float
    recorder: bool
    bundle_on: Any
    max_bundles: int
    max_bundle_bytes: int
    max_total_bytes: int
    record_history: bool
    signals: bool
    bundle_report: str
    run_report: str
    watchdog: Any
    sinks: Sequence[Any] | SinkSet | None
    tracemalloc: bool | int
    stage: str
    check_every_n_steps: int | str | None
    check_every_s: float | None
    horizon_s: float
    steps_per_epoch: int | None
    blackbox_every_s: float | None
    share: str


class WatchOptions(AdapterOptions, total=False):
    """Every option of :class:`memwatch.MemWatch` (see :class:`memwatch.WatchConfig` for what
    each does and its default)."""

    log_every_n_steps: int
    warn: bool


def option_names() -> tuple[str, ...]:
    """The names :class:`memwatch.WatchConfig` declares, in its order."""
    from memwatch.session.config import WatchConfig

    return tuple(f.name for f in dataclasses.fields(WatchConfig))


def check_names(options: Mapping[str, Any], who: str,
                extra: Iterable[str] = ()) -> None:
    """Raise :class:`ConfigError` for the first name of ``options`` that is not an option
    (nor one of ``extra``, an adapter's own arguments), naming the closest valid one."""
    valid = [*option_names(), *extra]
    for name in options:
        if name in valid:
            continue
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{who} got an unknown option {name!r}; {hint}the options are "
                          "documented on memwatch.WatchConfig (docs/configuration.md).")
