"""Tools for translating a framework's events, shared by the adapters: mapping its device,
finding what its events do not carry up the caller's frames, observing methods of objects that
have no hooks, epochs from data-loader passes, and the checks of adapter arguments.

Framework-agnostic: nothing here imports a framework.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.findings import Finding

if TYPE_CHECKING:
    from memwatch.integrations._driver import Driver

__all__ = ["Adapter", "FindingWarner", "LoaderPasses", "as_int", "check_choice", "guarded",
           "check_log_every", "device_spec", "failures_recorded", "from_caller_frames", "observe",
           "unobserve"]


def device_spec(device: Any) -> str:
    """memwatch's device spec for a framework's device (``torch.device`` or a string): CUDA and
    MPS are watched; CPU and accelerators memwatch has no probe for (XLA, NPU...) watch host
    memory only."""
    kind = getattr(device, "type", None) or str(device or "cpu").split(":")[0]
    if kind == "cuda":
        idx = getattr(device, "index", None)
        if idx is None and ":" in str(device):
            idx = str(device).split(":", 1)[1]
        return f"cuda:{idx}" if idx is not None else "cuda"
    return "mps" if kind == "mps" else "cpu"


def from_caller_frames(pick: Callable[[FrameType], Any], depth: int = 16) -> Any:
    """The first non-None ``pick(frame)`` up the caller's frames, else None: for frameworks
    whose events do not carry what an adapter needs (the trainer, a retry loop's batch size).
    Never on the hot path."""
    f: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return None
        got = pick(f)
        if got is not None:
            return got
        f = f.f_back
    return None


@contextmanager
def failures_recorded(adapter: Any) -> Iterator[Any]:
    """Any exception inside gets its bundle (``adapter.handle_exception``) and propagates
    unchanged; the adapter closes on the way out."""
    try:
        yield adapter
    except BaseException as e:
        adapter.handle_exception(e)  # KeyboardInterrupt/SystemExit: no bundle, still re-raised
        raise
    finally:
        adapter.close()


_OBSERVER = "_memwatch_observer"


def observe(obj: Any, events: dict[str, Callable[[Any], None]]) -> bool:
    """After each named method of ``obj`` runs, call ``events[name](obj)`` (for frameworks whose
    objects have no hooks: Accelerate's prepared DataLoaders end a pass in ``end()``).

    Instance attributes shadow the class's methods, so this touches neither the class nor other
    objects, and :func:`unobserve` restores ``obj`` exactly. False when ``obj`` lacks a method
    or is observed already (by another hook). The callbacks should hold weak references."""
    cls = type(obj)  # not obj.__class__: wrappers may report another class
    if not all(callable(getattr(cls, n, None)) for n in events) or \
            any(getattr(vars(obj).get(n), _OBSERVER, False) for n in events):
        return False
    for name, event in events.items():
        vars(obj)[name] = _observed(getattr(cls, name).__get__(obj, cls), event, obj)
    return True


def _observed(orig: Callable[[], Any], event: Callable[[Any], None], obj: Any) -> Any:
    def call() -> Any:
        out = orig()
        event(obj)
        return out

    setattr(call, _OBSERVER, True)
    return call


def unobserve(obj: Any) -> None:
    for name, value in list(vars(obj).items()):
        if getattr(value, _OBSERVER, False):
            del vars(obj)[name]


log = logging.getLogger("memwatch")
F = TypeVar("F", bound=Callable[..., Any])


def guarded(what: str, then: str | None = None) -> Callable[[F], F]:
    """For an adapter method a framework calls from its training loop: an exception logs one
    warning naming ``what`` failed and why, and training goes on (with ``then``, that method of
    the adapter runs first, e.g. ``"detach"``). memwatch never raises into a training loop."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: %s failed (%s: %s); %s", what, type(e).__name__, e,
                            f"{then} and training continues" if then else "training continues")
                if then is not None:
                    getattr(self, then)()
                return None

        return call  # type: ignore[return-value]

    return wrap


def check_choice(name: str, value: Any, ok: bool, fix: str) -> None:
    """A constructor argument the adapter validates itself: ConfigError naming it and the fix."""
    if not ok:
        raise ConfigError(f"{name}={value!r} is not understood; {fix}.")


def as_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def check_log_every(value: Any, fix: str) -> None:
    """``log_every_n_steps`` must be a positive int; ``fix`` ends the message (", e.g. 50.")."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"log_every_n_steps={value!r} must be an int >= 1{fix}")


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


class FindingWarner:
    """A :class:`memwatch.MemWatchWarning` once per (stage, kind, metric), and once more when a
    later verdict names the holder the first could not (the census needs two checks)."""

    def __init__(self) -> None:
        #: (stage, kind, metric) already warned about; checkpointable as a list of lists.
        self.warned: set[tuple[str, str, str]] = set()

    def warn(self, f: Finding, labels: str = "", stacklevel: int = 2) -> None:
        key = (f.stage, f.kind, f.metric)
        named = (f.stage, f.kind, f.metric + "#culprit")
        if key in self.warned and (not f.culprit or named in self.warned):
            return
        self.warned.add(key)
        if f.culprit:
            self.warned.add(named)
        text = f"memwatch{labels}: {f.kind} in {f.metric}: {f.message}"
        if f.culprit and f.culprit not in text:
            text += f" Held by: {f.culprit}."
        if f.suggestions:
            text += " Try: " + "; ".join(f.suggestions)
        warnings.warn(text, MemWatchWarning, stacklevel=stacklevel + 1)


class Adapter:
    """What the three adapters expose the same way, read from their :class:`Driver` (``_d``).

    Attributes:
        memwatch: the training :class:`memwatch.MemWatch` (``None`` before training starts).
        eval_memwatch: ``{"val": MemWatch, "test": MemWatch}`` for the loops that ran.
        findings: every finding so far (the latest 1,000), training and evaluation.
        bundle_path: the flight-recorder bundle written when the run died, if any.
        stopped_by_memwatch, stop_reason: the graceful stop, and why.
        recovered_ooms: one dict per OOM a batch-size finder recovered from (``attempt``,
            ``step``, ``ooms``, ``batch_size``, ``failed_batch_size``, ``new_batch_size``,
            ``tried_to_allocate``, ``bundle``); ``recovered_oom_count``: their OOMs in all.
    """

    _d: Driver
    #: Read from the driver as they are.
    _FROM_DRIVER = frozenset({"memwatch", "eval_memwatch", "findings", "bundle_path",
                              "stopped_by_memwatch", "stop_reason", "recovered_ooms",
                              "recovered_oom_count"})

    def __getattr__(self, name: str) -> Any:
        if name in Adapter._FROM_DRIVER and "_d" in self.__dict__:
            return getattr(self.__dict__["_d"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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


