"""The watched process's side of ``memwatch run``: what watches this process, decided once.

The shim (:mod:`memwatch.autorun.shim.sitecustomize`) creates one :class:`Controller` in the
training script's process when torch or a framework is imported, and tells it about each of
those imports. The controller then:

* on ``import torch``: registers one process-wide optimizer step post-hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``) and starts a timer;
* when a Lightning or transformers ``Trainer`` is created: adds the framework's adapter, unless
  its callbacks already hold one (:mod:`memwatch.autorun.frameworks`);
* at the first optimizer step, when no adapter watches: attaches the Accelerate hook when an
  ``Accelerator`` exists, else starts its own session and samples it at every step of that
  optimizer (the *plain* loop: no epochs, the session's step- and time-based checks judge);
* when no optimizer has stepped ``60 x interval_s`` after torch was imported and nothing else
  watches: starts its own session sampled every ``interval_s`` by a thread (*time* mode: checks
  every ``check_every_s``), until an optimizer steps;
* when the script starts a :class:`memwatch.MemWatch` of its own (``watch()``, ``attach()``):
  closes its own session and adds nothing more;
* at exit: closes what it started (each session's last check, its ``report.html`` and
  ``summary.json``), prints the summary.

Nothing is attached twice: one mode at a time (:attr:`Controller.mode`), and the optimizer
hook does nothing while an adapter watches (Lightning and the transformers ``Trainer`` step the
optimizer too). Nothing here raises into the script: a failure logs one line and this process
goes on unwatched.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import weakref
from types import ModuleType
from typing import Any

from memwatch.autorun import frameworks
from memwatch.autorun.console import ConsoleSink, exit_lines, say, say_all
from memwatch.autorun.plan import Plan, read_plan
from memwatch.bundle.paths import per_rank
from memwatch.session import MemWatch, rank_info

log = logging.getLogger("memwatch")

__all__ = ["GRACE_INTERVALS", "RUN_DEFAULTS", "Controller"]

#: Time mode starts this many sampler intervals (a minute by default) after torch's import
#: without an optimizer step or a Trainer: a script that trains is not sampled by time while it
#: loads its data.
GRACE_INTERVALS = 60
#: Where ``memwatch run``'s defaults differ from ``memwatch.watch()``'s: the console says each
#: verdict (no MemWatchWarning in the script), and the report at exit has its charts.
RUN_DEFAULTS: dict[str, Any] = {"warn": False, "run_report": "full"}
#: Modes in which the optimizer hook has nothing left to decide.
_SETTLED = ("adapter", "user", "off")
_MARK = "_memwatch_autorun"


class Controller:
    """Decides and drives what watches the training script's process (one per process).

    Attributes:
        mode: ``None`` (undecided), ``"plain"``, ``"time"``, ``"adapter"``, ``"user"`` or
            ``"off"``.
        memwatch: the session this controller started (plain or time mode), else ``None``.
        adapters: the adapters it added (Lightning/transformers callbacks, Accelerate hooks).
        what: how the process is watched, in words (the summary at exit says it).
    """

    def __init__(self, plan: Plan | dict[str, Any]) -> None:
        self.plan = plan if isinstance(plan, Plan) else read_plan(plan)
        self.options: dict[str, Any] = {**RUN_DEFAULTS, **self.plan.options}
        if isinstance(self.options.get("bundle_on"), list):
            self.options["bundle_on"] = tuple(self.options["bundle_on"])
        info = rank_info()
        self.rank, self.world = info["rank"], info["world_size"]
        self.console = ConsoleSink(f" [rank {self.rank}]" if self.world > 1 else "")
        self.mode: str | None = None
        self.memwatch: MemWatch | None = None
        self.adapters: list[Any] = []
        self.what = "nothing: no optimizer stepped and no Trainer was created"
        self._opt_id: int | None = None
        self._opt_ref: Any = None
        self._step = _nothing
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._accelerators: list[weakref.ref[Any]] = []
        self._pid = os.getpid()
        self._starting = False
        self._handles: list[Any] = []
        self._start_unwatched = self._watch_sessions()
        atexit.register(self.at_exit)

    # ------------------------------------------------------------------ imports
    def on_import(self, name: str, module: ModuleType) -> None:
        """The shim saw ``name`` imported (one of its watched modules)."""
        if name == "torch":
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._handles.append(register_optimizer_step_post_hook(self.on_step))
            grace = GRACE_INTERVALS * float(self.options.get("interval_s") or 1.0)
            threading.Thread(target=self._tick, args=(grace,), name="memwatch-run-timer",
                             daemon=True).start()
        elif name.endswith(".trainer.trainer"):  # lightning.pytorch or pytorch_lightning
            package = name[: -len(".trainer.trainer")]
            frameworks.wrap_init(module.Trainer,
                                 self._guarded(frameworks.lightning, self, package))
        elif name == "transformers.trainer":
            frameworks.wrap_init(module.Trainer, self._guarded(frameworks.transformers, self))
        elif name == "accelerate.accelerator":
            frameworks.wrap_init(module.Accelerator, self._guarded(self._accelerator_made))

    def _guarded(self, fn: Any, *first: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any) -> None:
            try:
                fn(*first, *args)
            except Exception as e:  # noqa: BLE001 - the script goes on, unwatched
                self.fail(f"attaching memwatch ({getattr(fn, '__name__', fn)})", e)

        return call

    def fail(self, what: str, e: BaseException) -> None:
        say(f"{what} failed ({type(e).__name__}: {e}); this process goes on unwatched",
            self.console.label)
        with self._lock:
            self.mode = "off"
            self._opt_id = None

    # ------------------------------------------------------------------ the optimizer hook
    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """torch's global optimizer step post-hook: every ``optimizer.step()`` of the process."""
        if id(optimizer) == self._opt_id:
            self._step()  # the hot path: MemWatch.step, as the adapters call it
            return
        if self.mode in _SETTLED:
            return
        try:
            self._first_step(optimizer)
        except Exception as e:  # noqa: BLE001
            self.fail("watching the optimizer", e)

    def _first_step(self, optimizer: Any) -> None:
        with self._lock:
            if self.mode in _SETTLED:
                return
            if self.mode == "plain" and self._opt_ref is not None and self._opt_ref() is not None:
                return  # another optimizer than the one sampled (a GAN's second one)
            if self.mode in (None, "time"):  # time mode: sampled by time until this step
                acc = next((a for r in reversed(self._accelerators) if (a := r()) is not None),
                           None)
                if acc is not None:
                    self.take_over(frameworks.accelerate(self, acc, optimizer),
                                   "the Accelerate loop (memwatch.integrations.accelerate hook "
                                   "on its optimizer)")
                    return
            if self.memwatch is None:
                self._start_session()
            else:  # time mode's session: this thread steps it from now on (the timer stops)
                self.memwatch.hand_over()
            self.mode = "plain"
            self.what = ("the plain loop (every step of its optimizer, through torch's "
                         "optimizer step hook)")
            self._opt_ref = weakref.ref(optimizer, self._optimizer_gone)
            self._opt_id = id(optimizer)
        self._step()  # this step is the first sample

    def _optimizer_gone(self, ref: Any) -> None:
        if ref is self._opt_ref:
            self._opt_id = None  # the next optimizer to step is sampled

    def _accelerator_made(self, acc: Any) -> None:
        self._accelerators = [r for r in self._accelerators if r() is not None]
        self._accelerators.append(weakref.ref(acc))

    # ------------------------------------------------------------------ sessions
    def session_options(self) -> dict[str, Any]:
        """The options of the session this controller starts: the user's, the default output
        folder (``memwatch``, one folder per rank when several processes train), the console
        and, when the script uses W&B, a W&B sink that never moves the run's step."""
        from memwatch.sinks.wandb import WandbSink

        info = rank_info()  # torch.distributed may be initialised by now
        self.rank, self.world = info["rank"], info["world_size"]
        self.console.label = f" [rank {self.rank}]" if self.world > 1 else ""
        opts = dict(self.options)
        opts["out_dir"] = per_rank(os.path.abspath(opts.get("out_dir") or "memwatch"),
                                   self.rank, self.world)
        opts["sinks"] = [self.console, WandbSink(commit=False)]
        return opts

    def _start_session(self) -> None:
        self._starting = True
        try:
            self.memwatch = MemWatch(**self.session_options()).start()
        finally:
            self._starting = False
        # Nothing here ends epochs: its first checks may judge leaks (no epoch-scoped
        # accumulation to wait for).
        self.memwatch.plan_run(epochs=False)
        self._step = self.memwatch.step

    def _tick(self, grace: float) -> None:
        """Time mode: no optimizer has stepped ``grace`` seconds after torch's import."""
        if self._stop.wait(grace):
            return
        try:
            with self._lock:
                if self.mode is not None:
                    return
                self._start_session()
                self.mode = "time"
                self.what = (f"the script by time (no optimizer stepped: a sample every "
                             f"{float(self.options.get('interval_s') or 1.0):g} s)")
            every = float(self.options.get("interval_s") or 1.0)
            while not self._stop.wait(every):
                with self._lock:
                    if self.mode != "time":
                        return
                    self._step()
        except Exception as e:  # noqa: BLE001
            self.fail("sampling by time", e)

    def take_over(self, adapter: Any, what: str) -> None:
        """An adapter watches from now on: the controller's own session (if any) closes."""
        with self._lock:
            self._close_own()
            self.mode = "adapter"
            self.what = what
            if adapter is not None:
                self.adapters.append(adapter)

    def user_watches(self, what: str) -> None:
        """The script watches itself (its own adapter or session): nothing more is added."""
        with self._lock:
            if self.mode in _SETTLED:
                return
            self._close_own()
            self.mode = "user"
            self.what = what

    def _close_own(self) -> None:
        mw, self.memwatch = self.memwatch, None
        self._opt_id, self._opt_ref, self._step = None, None, _nothing
        if mw is not None:
            mw.close()

    def _watch_sessions(self) -> Any:
        """Know when the script starts a MemWatch of its own (``watch()``, ``attach()``...);
        returns ``MemWatch.start`` as it was."""
        start = MemWatch.start
        if getattr(start, _MARK, False):
            return getattr(start, "__wrapped__", start)
        me = weakref.ref(self)

        @functools.wraps(start)
        def watched_start(mw: MemWatch) -> MemWatch:
            out = start(mw)
            ctl = me()
            if ctl is not None and not ctl._starting and ctl.mode not in _SETTLED:
                ctl.user_watches("the script's own MemWatch (memwatch run added nothing)")
            return out

        setattr(watched_start, _MARK, True)
        MemWatch.start = watched_start  # type: ignore[method-assign,assignment]
        return start

    def detach(self) -> None:
        """Undo what this controller did to the process (hooks, ``MemWatch.start``, the timer,
        the exit summary) and close its own session; for tests, which run it in-process."""
        self._stop.set()
        atexit.unregister(self.at_exit)
        for h in self._handles:
            h.remove()
        self._handles = []
        if getattr(MemWatch.start, _MARK, False):
            MemWatch.start = self._start_unwatched  # type: ignore[method-assign]
        with self._lock:
            self._close_own()
            self.mode = "off"

    # ------------------------------------------------------------------ exit
    def at_exit(self) -> None:
        """Close what this controller started, write the report, print the summary."""
        if os.getpid() != self._pid:
            return  # a forked child (a DataLoader worker) owns none of this
        self._stop.set()
        try:
            with self._lock:
                mode, self.mode = self.mode, "off"
                own = self.memwatch
            died = getattr(sys, "last_value", None)
            if mode == "user":
                say(f"watched by {self.what}", self.console.label)
                return
            sessions = [own] if own is not None else []
            for a in self.adapters:
                a.close()
                if getattr(a, "memwatch", None) is not None:
                    sessions.append(a.memwatch)
            if own is not None:
                own.close()
            bundle = getattr(died, "memwatch_bundle", None)
            if not sessions and died is not None and bundle is None:
                bundle = self._bundle_of_early_death(died)
            mw = sessions[0] if sessions else None
            if mw is None:
                lines = [f"watched {self.what}"] + ([] if bundle is None else [
                    f"bundle of the failure: {bundle} (`memwatch inspect {bundle}`)"])
            else:
                lines = exit_lines(self.what, mw.step_count, mw.checks, mw.findings,
                                   mw.report_path, bundle, summary=mw.summary_path,
                                   unit="sample" if mode == "time" else "step")
            say_all(lines, self.console.label)
        except Exception as e:  # noqa: BLE001 - the exit code is the script's, whatever happens
            say(f"the summary at exit failed ({type(e).__name__}: {e})", self.console.label)

    def _bundle_of_early_death(self, exc: BaseException) -> Any:
        """The script died before anything was watched (an OOM while building the model): a
        short-lived session writes the bundle its class calls for (OOMs by default)."""
        opts = {**self.session_options(), "analyze": False, "signals": False,
                "watchdog": False, "blackbox_every_s": None, "sinks": [self.console],
                "run_report": "none"}
        self._starting = True
        mw = MemWatch(**opts).start()
        self._starting = False
        try:
            return mw.handle_exception(exc)
        finally:
            mw.close()


def _nothing() -> None:
    return None
