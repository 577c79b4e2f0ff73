"""What the adapters expose the same way (:class:`Adapter`, read from their driver), and epochs
from data-loader passes (:class:`LoaderPasses`, for loops without epoch events)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memwatch.core.findings import Finding
from memwatch.integrations._driver import Driver
from memwatch.integrations._framework import observe, unobserve
from memwatch.session import MemWatch

__all__ = ["Adapter", "LoaderPasses"]


class Adapter:
    """What the three adapters expose the same way, read from their :class:`Driver` (``_d``).

    Attributes:
        memwatch: the training :class:`memwatch.MemWatch` (``None`` before training starts).
        eval_memwatch: ``{"val": MemWatch, "test": MemWatch}`` for the loops that ran.
        findings: every finding so far (the latest 1,000), training and evaluation: the
            history of every belief; :meth:`current_findings` the current verdicts.
        bundle_path: the flight-recorder bundle written when the run died, if any.
        stopped_by_memwatch, stop_reason: the graceful stop, and why.
        recovered_ooms: one dict per OOM a batch-size finder recovered from (``attempt``,
            ``step``, ``ooms``, ``batch_size``, ``failed_batch_size``, ``new_batch_size``,
            ``tried_to_allocate``, ``bundle``); ``recovered_oom_count``: their OOMs in all.
    """

    _d: Driver

    @property
    def memwatch(self) -> MemWatch | None:
        return self._d.memwatch

    @property
    def eval_memwatch(self) -> dict[str, MemWatch]:
        return self._d.eval_memwatch

    @property
    def findings(self) -> list[Finding]:
        return self._d.findings

    def current_findings(self) -> list[Finding]:
        """The current verdicts of every loop: one finding per belief, its latest state (a
        leak whose growth stopped is its plateau); :attr:`findings` keeps the history."""
        return self._d.current_findings()

    @property
    def bundle_path(self) -> Path | None:
        return self._d.bundle_path

    @property
    def stopped_by_memwatch(self) -> bool:
        return self._d.stopped_by_memwatch

    @property
    def stop_reason(self) -> str | None:
        return self._d.stop_reason

    @property
    def recovered_ooms(self) -> list[dict[str, Any]]:
        return self._d.recovered_ooms

    @property
    def recovered_oom_count(self) -> int:
        return self._d.recovered_oom_count

    @property
    def should_stop(self) -> bool:
        """The watchdog asked the run to stop (see :attr:`stop_reason` once the adapter did)."""
        mw = self._d.memwatch
        return bool(mw is not None and mw.should_stop)

    def __exit__(self, tp: Any, exc: BaseException | None, tb: Any) -> None:
        """As a context manager (where the adapter is one): a failure inside gets its bundle
        and propagates unchanged; the adapter closes."""
        if exc is not None:
            self.handle_exception(exc)
        self.close()

    def close(self) -> None:
        """Close every session (idempotent, never raises)."""
        self._d.close()

    def handle_exception(self, exc: BaseException) -> Path | None:
        """Record a failure your code caught (a bundle when configured for its class); the
        flight recorder does this by itself for exceptions that end the program. Never raises."""
        return self._d.handle_exception(exc)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (``torch.load(weights_only=True)`` reads it): findings,
        warnings given, and the training session's :meth:`memwatch.MemWatch.state_dict`."""
        return self._d.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict` saved before a restart (before the first check of
        this run). A state that cannot be used logs a warning; never raises."""
        self._d.load_state_dict(state)


class LoaderPasses:
    """Epochs from data-loader passes: an epoch ends when a watched loader's pass ends after
    optimizer steps ran during it (an evaluation loader, during which none run, ends nothing)
    and since the last epoch end. The loader must call ``begin()``/``end()`` around each pass
    (Accelerate's prepared DataLoaders do); it is observed with :func:`observe` and holds only
    a weak reference to this tracker."""

    def __init__(self, driver: Driver) -> None:
        self._d = driver
        self._loaders: list[weakref.ref[Any]] = []
        self._start: dict[int, int] = {}
        self._known: tuple[int, int] = (0, -1)
        self.last_epoch_step = 0

    def _steps(self) -> int:
        mw = self._d.memwatch
        return mw.step_count if mw is not None else 0

    def watch(self, loader: Any, iterating: bool = False) -> None:
        """Watch ``loader`` (``iterating``: its pass already began, so it starts now)."""
        events = {name: _weak_event(self, name) for name in ("begin", "end")}
        if any(r() is loader for r in self._loaders) or not observe(loader, events):
            return
        self._loaders = [r for r in self._loaders if r() is not None] + [weakref.ref(loader)]
        if iterating:
            self._start[id(loader)] = self._steps()

    def watch_list(self, loaders: Any, iterating: Callable[[Any], bool]) -> None:
        """Watch every loader of a list the framework keeps (cheap while the list is the same
        object of the same length)."""
        key = (id(loaders), len(loaders))
        if key != self._known:
            self._known = key
            for loader in list(loaders):
                self.watch(loader, iterating(loader))

    def _event(self, name: str, loader: Any) -> None:
        if name == "begin":
            self._start[id(loader)] = self._steps()
            return
        start = self._start.pop(id(loader), None)
        if start is not None and self._steps() > max(start, self.last_epoch_step):
            self.end_epoch()

    def end_epoch(self) -> list[Finding]:
        """End the epoch now; nothing when no optimizer step ran since the last epoch end."""
        mw = self._d.memwatch
        if mw is None or not mw.running or mw.step_count <= self.last_epoch_step:
            return []
        self.last_epoch_step = mw.step_count
        return self._d.end_epoch("train")

    def release(self) -> None:
        """Stop watching every loader (they are restored exactly)."""
        for r in self._loaders:
            if (loader := r()) is not None:
                unobserve(loader)
        self._loaders, self._start, self._known = [], {}, (0, -1)


def _weak_event(tracker: LoaderPasses, name: str) -> Callable[[Any], None]:
    """``tracker._event(name, loader)`` while the tracker lives (a loader must not keep it)."""
    ref = weakref.ref(tracker)

    def call(loader: Any) -> None:
        t = ref()
        if t is not None:
            t._event(name, loader)

    return call
