"""How ``memwatch run`` attaches the framework adapters to objects the script creates.

:func:`wrap_init` makes a class call a function with each new instance (after its own
``__init__``); the controller wraps Lightning's and transformers' ``Trainer`` and Accelerate's
``Accelerator`` once their modules are imported. Each adapter module is imported here only then,
so no framework is imported that the script did not import itself.

* :func:`lightning`: a :class:`memwatch.integrations.lightning.MemWatchCallback` appended to
  ``trainer.callbacks``, unless one is there already.
* :func:`transformers`: a :class:`memwatch.integrations.transformers.MemWatchCallback` added
  with ``trainer.add_callback`` (and attached to the trainer), unless one is there already.
* :func:`accelerate`: :func:`memwatch.integrations.accelerate.attach` on the optimizer that just
  stepped, called by the controller at the first step when an ``Accelerator`` exists.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any, Protocol

from memwatch.autorun.console import ConsoleSink, say
from memwatch.bundle.paths import per_rank

__all__ = ["accelerate", "lightning", "transformers", "wrap_init"]

_MARK = "_memwatch_autorun"


class Controller(Protocol):
    """What these functions use of :class:`memwatch.autorun.controller.Controller`."""

    options: dict[str, Any]
    console: ConsoleSink

    def take_over(self, adapter: Any, what: str) -> None: ...

    def user_watches(self, what: str) -> None: ...


def wrap_init(cls: type, after: Callable[[Any], None]) -> None:
    """Call ``after(instance)`` once each new instance of ``cls`` (or of a subclass, defined
    before or after this call) is fully built: after the outermost ``__init__`` returns, so a
    subclass that adds its own callbacks after ``super().__init__()`` is seen whole. Once per
    class; signatures (``inspect.signature``) are unchanged."""
    init = vars(cls)["__init__"] if "__init__" in vars(cls) else None
    if init is None or getattr(init, _MARK, False):
        return
    own = vars(cls).get("__init_subclass__")

    def __init_subclass__(sub: Any, /, **kwargs: Any) -> None:
        if own is not None:
            own.__get__(None, sub)(**kwargs)
        else:
            super(cls, sub).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        _wrap_own_init(sub, after)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    for c in [cls, *_subclasses(cls)]:  # subclasses defined before this call too
        _wrap_own_init(c, after)


def _wrap_own_init(cls: type, after: Callable[[Any], None]) -> None:
    init = vars(cls).get("__init__")
    if init is not None and not getattr(init, _MARK, False):
        cls.__init__ = _outermost(init, after)  # type: ignore[misc]


#: Instances whose ``__init__`` is running -> how deep (a subclass's, then its super()'s...).
_building: dict[int, int] = {}


def _outermost(init: Any, after: Callable[[Any], None]) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        key = id(self)
        _building[key] = _building.get(key, 0) + 1
        try:
            init(self, *args, **kwargs)
        finally:
            depth = _building.pop(key) - 1
            if depth:
                _building[key] = depth
        if not depth:
            after(self)

    setattr(__init__, _MARK, True)
    return __init__


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def _rank(default_world: int = 1) -> tuple[int, int]:
    env = os.environ
    rank = int(env.get("RANK") or env.get("LOCAL_RANK") or 0)
    world = int(env.get("WORLD_SIZE") or default_world or 1)
    return rank, world


def adapter_options(ctl: Controller, world: int, rank: int, **extra: Any) -> dict[str, Any]:
    """The user's options for an adapter, the console as a sink; an ``--out-dir`` given gets a
    folder per rank when several processes train (the adapters' own default does too)."""
    opts = dict(ctl.options)
    if opts.get("out_dir"):
        opts["out_dir"] = per_rank(os.path.abspath(str(opts["out_dir"])), rank, world)
    opts["sinks"] = [ctl.console, *extra.pop("sinks", [])]
    return {**opts, **extra}


def lightning(ctl: Controller, package: str, trainer: Any) -> None:
    """A Lightning ``Trainer`` of ``package`` (``lightning.pytorch`` or ``pytorch_lightning``)
    was created."""
    from memwatch.integrations.lightning import MemWatchCallback

    callbacks = trainer.callbacks
    if any(isinstance(c, MemWatchCallback) for c in callbacks):
        ctl.user_watches("the script's own MemWatchCallback (memwatch run added nothing)")
        return
    base = getattr(importlib.import_module(f"{package}.callbacks"), "Callback", None)
    if base is None or not issubclass(MemWatchCallback, base):
        # memwatch's callback is a lightning.pytorch one; this Trainer comes from another
        # package: its optimizer steps are watched as a plain loop instead.
        say(f"a {package} Trainer takes no lightning.pytorch callback: its optimizer steps are "
            "watched as a plain loop", ctl.console.label)
        return
    rank, world = _rank(int(getattr(trainer, "world_size", 1) or 1))
    cb = MemWatchCallback(**adapter_options(ctl, world, rank))
    callbacks.append(cb)
    ctl.take_over(cb, "the Lightning Trainer (memwatch.integrations.lightning."
                      "MemWatchCallback, added to its callbacks)")


def transformers(ctl: Controller, trainer: Any) -> None:
    """A transformers ``Trainer`` (or a subclass: ``Seq2SeqTrainer``, TRL's...) was created."""
    from memwatch.integrations.transformers import MemWatchCallback

    handler = trainer.callback_handler
    if any(isinstance(c, MemWatchCallback) for c in handler.callbacks):
        ctl.user_watches("the script's own MemWatchCallback (memwatch run added nothing)")
        return
    args = trainer.args
    world = int(getattr(args, "world_size", 1) or 1)
    # (with report_to W&B, the callback adds memwatch's W&B sink itself)
    cb = MemWatchCallback(**adapter_options(ctl, world, int(getattr(args, "process_index", 0))))
    trainer.add_callback(cb)
    cb.attach(trainer)
    ctl.take_over(cb, "the transformers Trainer (memwatch.integrations.transformers."
                      "MemWatchCallback, added to its callbacks)")


def accelerate(ctl: Controller, accelerator: Any, optimizer: Any) -> Any:
    """The first optimizer step of a loop with an ``Accelerator``: its hook, on that optimizer
    (the hook samples from the next step on). Called by the controller; returns the hook."""
    from memwatch.integrations.accelerate import attach

    # (with a W&B tracker, the hook adds memwatch's W&B sink itself)
    world = int(getattr(accelerator, "num_processes", 1) or 1)
    rank = int(getattr(accelerator, "process_index", 0) or 0)
    return attach(accelerator, optimizer, **adapter_options(ctl, world, rank))
