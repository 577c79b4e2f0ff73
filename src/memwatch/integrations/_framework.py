"""Tools for translating a framework's events, shared by the adapters: mapping its device,
finding what its events do not carry up the caller's frames, observing methods of objects that
have no hooks, epochs from data-loader passes, and the checks of adapter arguments.

Framework-agnostic: nothing here imports a framework.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

from memwatch.core.errors import ConfigError

__all__ = ["as_int", "check_choice", "check_log_every", "device_spec", "failures_recorded",
           "from_caller_frames", "guarded", "observe", "own_arguments", "unobserve"]


def own_arguments(cls: type) -> tuple[str, ...]:
    """The keyword arguments an adapter's ``__init__`` declares itself (not its ``**options``):
    a misspelled one is named as the closest valid name."""
    import inspect

    params = inspect.signature(cls).parameters.values()
    return tuple(p.name for p in params if p.kind in (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


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


