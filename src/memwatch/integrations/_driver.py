"""The one adapter driver: everything the Lightning and transformers callbacks and the Accelerate
hook do the same way, so each adapter only translates its framework's events.

A :class:`Driver` owns, for one adapter:

* the training session and one evaluation session per loop (``"val"``, ``"test"``), created
  with the framework's device and output folder as defaults (:meth:`Driver.configure`);
* one :class:`memwatch.sinks.SinkSet` shared by all of them: the user's sinks and the
  framework's own loggers (:mod:`memwatch.integrations._loggers`), so there is one fan-out and
  one failure rule;
* the findings of every session, the warnings given, recovered OOMs (one schema), the graceful
  stop and its reason, the failure bundle, and the checkpoint state (a dict, or a file beside
  the framework's checkpoint).

Nothing here imports a framework, and nothing raises into the training loop after construction.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memwatch.analysis.beliefs import current
from memwatch.bundle.paths import per_rank
from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.core.metrics import PREFIX
from memwatch.integrations._framework import check_log_every, device_spec, own_arguments
from memwatch.integrations._state import (
    ADAPTER_STATE_VERSION,
    STATE_FILE,
    RestoredState,
    read_adapter_state,
)
from memwatch.runtime.dispatch import FindingsTap, SinkSet
from memwatch.runtime.resume import plain
from memwatch.runtime.warn import FindingWarner, user_stacklevel
from memwatch.session import MemWatch, WatchConfig
from memwatch.session.options import check_names

__all__ = ["ADAPTER_STATE_VERSION", "GRACEFUL_STOP_WATCHDOG", "STATE_FILE", "Driver",
           "read_adapter_state"]

log = logging.getLogger("memwatch")

#: What ``graceful_stop=True`` asks of the watchdog when the user configured none: it decides when
#: to stop (OOM forecast within its horizon, or critical usage); the adapter turns that decision
#: into a checkpoint and a clean stop.
GRACEFUL_STOP_WATCHDOG: dict[str, Any] = {"on_critical": ("alert", "bundle", "stop"),
                                          "on_forecast": ("alert", "stop")}
_MAX_FINDINGS = 1000
_MAX_RECOVERED = 100


class Driver:
    """The sessions, fan-out, warnings, stops, failures and checkpoints of one adapter.

    Args:
        who: how errors name the adapter (``"MemWatchCallback"``, ``"attach()"``).
        adapter: the adapter's class: an unknown option's closest name may be one of its own
            arguments (``wach_eval`` -> ``watch_eval``).
        given: a :class:`memwatch.MemWatch` the user passed (then ``options`` must be empty); it
            drives the first training run, later runs get a new session with its options.
        options: :class:`memwatch.MemWatch` options, validated now.
        warn: warn once per new finding of severity warning or critical (without it, a new leak
            still gets its one-line notice).
        watch_eval: watch evaluation loops in sessions of their own.
        graceful_stop: the watchdog may stop the run (the adapter saves a checkpoint and stops);
            adds the stop actions to a watchdog the user did not configure.
        stage_labels: how warnings name a loop (``{"val": "val loop"}``).
    """

    def __init__(self, who: str, given: MemWatch | None, options: Mapping[str, Any], *,
                 adapter: type | None = None,
                 warn: bool = True, watch_eval: bool = True, graceful_stop: bool = False,
                 recovered_oom: str = "event", log_every: tuple[Any, str] | None = None,
                 stage_labels: dict[str, str] | None = None) -> None:
        if log_every is not None and log_every[0] is not None:
            check_log_every(*log_every)
        #: The adapter's own logging cadence, the sinks' default (None: the framework's).
        self.log_every_n_steps: int | None = log_every[0] if log_every is not None else None
        if recovered_oom not in ("event", "bundle"):
            raise ConfigError(
                f"recovered_oom={recovered_oom!r}: use 'event' (no bundle) or 'bundle' (one "
                "bundle for the first OOM a batch-size finder recovered from).")
        if given is not None and options:
            raise ConfigError(f"{who} got memwatch=... and MemWatch options {sorted(options)}; "
                              "configure the MemWatch you pass instead.")
        if given is not None and not isinstance(given, MemWatch):
            raise ConfigError(f"memwatch={given!r} is not a memwatch.MemWatch; pass one or "
                              "leave it None.")
        # A typo fails here, not in the middle of training: an unknown name (the closest of
        # the MemWatch options and the adapter's own arguments named), then every value.
        check_names(options, who, extra=own_arguments(adapter) if adapter is not None else ())
        options = dict(options)
        if graceful_stop and given is None and "watchdog" not in options:
            options["watchdog"] = dict(GRACEFUL_STOP_WATCHDOG)
        WatchConfig(**{"device": "cpu", **options})
        self.who, self.given, self.options = who, given, options
        self.warn, self.watch_eval = bool(warn), bool(watch_eval)
        self.graceful_stop, self.recovered_oom_mode = bool(graceful_stop), recovered_oom
        self.stage_labels = {"val": "val loop", "test": "test loop", "predict": "predict loop",
                             **(stage_labels or {})}
        #: The user's sinks and the framework's loggers: one fan-out, one failure rule.
        self.sinks = given.sinks if given is not None else SinkSet(options.pop("sinks", None))
        # Every check of every session of this adapter (epoch ends, and checks inside epochs,
        # which happen inside mw.step()) reports its findings here.
        self._fresh: list[tuple[str, str, Finding | None]] = []
        self.sinks.add(FindingsTap(self._fresh))
        self._loggers: list[Any] = []
        self.memwatch: MemWatch | None = None
        self.eval_memwatch: dict[str, MemWatch] = {}
        self.findings: list[Finding] = []
        self.bundle_path: Path | None = None
        self.recovered_ooms: list[dict[str, Any]] = []
        self.stopped_by_memwatch = False
        self.stop_reason: str | None = None
        self.warner = FindingWarner()
        self.device: Any = "cpu"
        self.out_dir = "memwatch"
        self.rank = 0
        self.world_size = 1
        self._given_used = False
        self._pending_state: RestoredState | None = None
        self._ooms_seen: float | None = None

    # ------------------------------------------------------------------ configuration
    def configure(self, device: Any, root: str | os.PathLike[str] | None, world_size: int = 1,
                  rank: int = 0) -> None:
        """The framework's defaults: the device it trains on and its output folder
        (``<root>/memwatch``, ``.../rank<N>`` when several processes train)."""
        self.world_size, self.rank = max(int(world_size or 1), 1), int(rank or 0)
        self.device = self.options.get("device", device_spec(device))
        given = self.options.get("out_dir")
        if given is not None:
            self.out_dir = str(os.fspath(given))
        else:
            out = os.path.join(os.fspath(root or os.getcwd()), "memwatch")
            self.out_dir = per_rank(out, self.rank, self.world_size)

    def use_loggers(self, sinks: list[Any]) -> None:
        """The framework's own loggers as sinks (replacing those of a previous run)."""
        for s in self._loggers:
            self.sinks.remove(s)
        self._loggers = list(sinks)
        mw = self.memwatch
        for s in self._loggers:
            if mw is not None and mw.running and mw.sinks is self.sinks:
                mw.add_sink(s)  # re-plans the running session's sample cadence
            else:
                self.sinks.add(s)

    def config(self, defaults: dict[str, Any] | None = None, **overrides: Any) -> WatchConfig:
        """The configuration of a session this driver starts: the user's options over the
        framework's ``defaults``, then ``overrides``."""
        if self.given is not None:
            base = dataclasses.replace(self.given.config, sinks=self.sinks)
        else:
            # The driver warns about every session's findings itself (with the rank and loop).
            base = WatchConfig(**{"device": self.device, "out_dir": self.out_dir, "warn": False,
                                  **(defaults or {}), **self.options, "sinks": self.sinks})
        return dataclasses.replace(base, **overrides) if overrides else base

    # ------------------------------------------------------------------ training
    def start(self, total_steps: Any = None, steps_per_epoch: Any = None,
              **defaults: Any) -> MemWatch | None:
        """Start the training session (the given one first; ``defaults``: MemWatch options the
        framework suggests, under the user's); None when it cannot start."""
        mw = self.memwatch
        if mw is not None and mw.running:
            return mw
        try:
            if self.given is not None and not self._given_used:
                mw = self.given
                self._given_used = True
            else:
                if self.log_every_n_steps is not None:
                    defaults.setdefault("log_every_n_steps", self.log_every_n_steps)
                mw = MemWatch.from_config(self.config(defaults))
            mw.start()
        except Exception as e:  # noqa: BLE001 - a broken watcher must not stop training
            log.warning("memwatch: could not start (%s: %s); training continues unwatched",
                        type(e).__name__, e)
            self.memwatch = None
            return None
        self.memwatch = mw
        self._ooms_seen = self.device_ooms()
        self.set_total_steps(total_steps, steps_per_epoch)
        if self._pending_state is not None:
            self._restore(self._pending_state)
        return mw

    def set_total_steps(self, total: Any, steps_per_epoch: Any = None) -> None:
        """The run's planned length and its epochs' length, for forecasts and for telling
        accumulation from leaks (each ignored when unknown or set by the user)."""
        mw = self.memwatch
        if mw is None:
            return
        mw.plan_run(_positive_int(total), _positive_int(steps_per_epoch))

    def step(self) -> None:
        mw = self.memwatch
        if mw is not None:
            mw.step()
            if self._fresh:  # a check ran inside the epoch
                self._take_fresh()

    def wants_stop(self) -> bool:
        """The watchdog asked this process to stop and the adapter has not stopped yet."""
        mw = self.memwatch
        return bool(self.graceful_stop and mw is not None and mw.should_stop
                    and not self.stopped_by_memwatch)

    def stopping(self, what: str) -> None:
        """The adapter is stopping the run (``what`` it did: "checkpoint saved to ..."); warns
        once with the true reason."""
        if self.stopped_by_memwatch:
            return
        self.stopped_by_memwatch = True
        mw = self.memwatch
        self.stop_reason = (mw.stop_reason if mw is not None else None) or \
            "another rank's memwatch asked the job to stop"
        warnings.warn(f"memwatch: stopping training ({self.stop_reason}); {what}",
                      MemWatchWarning, stacklevel=user_stacklevel())

    # ------------------------------------------------------------------ checks
    def end_epoch(self, stage: str = "train", epoch_end_follows: bool = False) -> list[Finding]:
        """The epoch of ``stage`` ended: its check's findings (logged through the sinks by the
        session), kept and warned about. An evaluation's end is a boundary of training: its
        next check (now, unless the training epoch end ``epoch_end_follows``) reads what the
        evaluation kept."""
        mw = self.memwatch if stage == "train" else self.eval_memwatch.get(stage)
        if mw is not None and mw.running:
            mw.end_epoch()  # never raises (the session disables what fails)
        train = self.memwatch
        if stage != "train" and train is not None and train.running:
            train.boundary(stage, check=not epoch_end_follows)
        return self._take_fresh()

    def _take_fresh(self) -> list[Finding]:
        """The findings the checks reported since last time: kept, and warned about (outside
        the sinks' dispatch: a warnings filter set to "error" is the user's to see)."""
        fresh, self._fresh[:] = list(self._fresh), []
        new = [f for _, _, f in fresh if f is not None]
        self.findings.extend(new)
        del self.findings[:-_MAX_FINDINGS]  # bounded, like the session's own list
        # Threats are warned about (warn=True); every new leak, whatever its severity, reaches
        # the console once (runtime/warn.py); other info findings stay silent, so a clean run
        # is quiet. A session the user passed, which warns itself, said its own already.
        for at, stage, f in fresh:
            if f is None:  # a check's end: a notice that waited a check for its holder
                self.warner.end_check(at, stage)
                continue
            labels = f" [rank {self.rank}]" if self.world_size > 1 else ""
            if f.stage != "train":
                labels += f" [{self.stage_labels.get(f.stage, f.stage)}]"
            self.warner.tell([f], labels, warn=self.warn, at=at)
        return new

    def eval_start(self, stage: str) -> MemWatch | None:
        """A session of its own for an evaluation loop (kept across its runs)."""
        mw = self.eval_memwatch.get(stage)
        if not self.watch_eval or (mw is not None and mw.running):
            return mw
        try:
            train = self.memwatch
            base = train.config if train is not None else self.config()
            mw = MemWatch.from_config(dataclasses.replace(base.for_evaluation(stage),
                                                          sinks=self.sinks))
            if train is not None and train.running:  # one leak, one verdict: training's
                mw.judge_beside_training()
            mw.start()
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not watch the %s loop (%s: %s)", stage,
                        type(e).__name__, e)
            return None
        self.eval_memwatch[stage] = mw
        return mw

    def current_findings(self) -> list[Finding]:
        """The current verdicts of every session: one finding per belief, its latest state."""
        return current(self.findings)

    def eval_step(self, stage: str) -> None:
        mw = self.eval_memwatch.get(stage)
        if mw is not None:
            mw.step()

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Logger keys reported outside checks, to the framework's loggers."""
        self.sinks.log(metrics, step if step is not None else self._step())

    def _step(self) -> int:
        return self.memwatch.step_count if self.memwatch is not None else 0

    # ------------------------------------------------------------------ failures
    def handle_exception(self, exc: BaseException) -> Path | None:
        """Record a failure: a bundle when configured for its class, from the training session,
        an evaluation session, or a short-lived one when none runs. Never raises."""
        try:
            mw = next((m for m in (self.memwatch, *self.eval_memwatch.values())
                       if m is not None and m.recorder is not None), None)
            temp = None
            if mw is None:
                # Died before training started (or the recorder was off): a short-lived session
                # still writes the bundle with what can be captured now.
                temp = MemWatch.from_config(self.config(signals=False, watchdog=False,
                                                        analyze=False, sinks=None))
                mw = temp.start()
            try:
                path = mw.handle_exception(exc)
            finally:
                if temp is not None:
                    temp.close()
            if path is not None:
                self.bundle_path = Path(path)
                self.sinks.log({f"{PREFIX}/oom": 1.0}, self._step())
                self.sinks.notify("on_failure_bundle", self.bundle_path)
            return path
        except Exception as e:  # noqa: BLE001 - the user's exception must go on unchanged
            log.warning("memwatch: could not record the failure (%s: %s)", type(e).__name__, e)
            return None

    def device_ooms(self) -> float | None:
        """The device's out-of-memory counter now (None without a device that counts them)."""
        mw = self.memwatch
        dev = mw.device if mw is not None else None
        if dev is None or "device.ooms" not in dev.fast_keys:
            return None
        return float(dev.read_fast()[list(dev.fast_keys).index("device.ooms")])

    def recovered_oom(self, *, ooms: int | None = None, failed_batch_size: int | None = None,
                      new_batch_size: int | None = None, restart: bool = False,
                      batch_key: str | None = None) -> dict[str, Any]:
        """OOMs the program caught and retried (a batch-size finder): an event, no bundle
        (``recovered_oom="bundle"``: one small bundle for the first of them). One schema for
        every adapter; ``batch_size`` is the failed size when known, else the new one.
        ``ooms=None``: how many the device counted since the previous event (a finder catches
        one per smaller batch it tries), at least one.

        ``restart``: the failed attempt's sessions close and the next attempt starts fresh (its
        samples describe another batch size). Logs ``memwatch/recovered_ooms`` (and the new
        batch size under ``batch_key``)."""
        mw = self.memwatch
        if ooms is None:
            now = self.device_ooms()
            before, self._ooms_seen = self._ooms_seen, now
            ooms = int(now - before) if now is not None and before is not None \
                and now - before >= 1 else 1
        size = failed_batch_size if failed_batch_size is not None else new_batch_size
        event: dict[str, Any] = {
            "attempt": len(self.recovered_ooms) + 1, "step": mw.step_count if mw else None,
            "ooms": int(ooms), "batch_size": size, "failed_batch_size": failed_batch_size,
            "new_batch_size": new_batch_size, "tried_to_allocate": None, "bundle": None}
        try:
            rec = mw.recorder if mw is not None else None
            cap = rec.take_pending() if rec is not None else None
            if cap is not None and cap.observer:
                event["tried_to_allocate"] = cap.observer.get("tried_to_allocate")
            if rec is not None and cap is not None and self.recovered_oom_mode == "bundle" \
                    and not any(e["bundle"] for e in self.recovered_ooms):
                path = rec.write_recovered(dataclasses.replace(cap, snapshot=None), (
                    f"out of memory at batch size {size}; recovered by the batch-size finder, "
                    "which retried with a smaller batch"))
                event["bundle"] = None if path is None else str(path)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not record the recovered OOM (%s: %s)",
                        type(e).__name__, e)
        self.recovered_ooms.append(event)
        del self.recovered_ooms[:-_MAX_RECOVERED]
        log.info("memwatch: %d out-of-memory error(s) at batch size %s recovered by a "
                 "batch-size finder (no bundle written)", ooms, size)
        if restart:
            self.reset()
        values = {f"{PREFIX}/recovered_ooms": float(self.recovered_oom_count)}
        if batch_key is not None and new_batch_size is not None:
            values[f"{PREFIX}/{batch_key}"] = float(new_batch_size)
        self.log(values)
        return event

    @property
    def recovered_oom_count(self) -> int:
        return sum(int(e["ooms"]) for e in self.recovered_ooms)

    def has_pending_oom(self) -> bool:
        """An OOM was captured before the unwind and nobody claimed it yet."""
        rec = self.memwatch.recorder if self.memwatch is not None else None
        return rec is not None and rec.has_pending()

    def close(self) -> None:
        """Close every session and the sinks (idempotent, never raises)."""
        for mw in [self.memwatch, *self.eval_memwatch.values()]:
            if mw is not None:
                mw.close()
        self._take_fresh()  # what the closing checks found; waiting notices said
        self.warner.flush()
        self.sinks.close()

    def reset(self) -> None:
        """Forget the sessions (a batch-size finder's retry starts fresh)."""
        self.close()
        self.memwatch = None
        self.eval_memwatch = {}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint: findings, warnings given, the training session's
        :meth:`memwatch.MemWatch.state_dict`, and this process's rank."""
        state: dict[str, Any] = {"version": ADAPTER_STATE_VERSION, "rank": self.rank,
                                 "findings": [], "warned": []}
        try:
            state["findings"] = [plain(f.to_dict()) for f in self.findings]
            state["warned"] = [list(k) for k in sorted(self.warner.warned)]
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: findings not saved with the checkpoint (%s: %s)",
                        type(e).__name__, e)
        if self.memwatch is not None:
            state["train"] = self.memwatch.state_dict()  # never raises
        return state

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict` (now, or when training starts). Never raises."""
        restored = read_adapter_state(state)
        if restored is None:
            return
        if restored.rank is not None and int(restored.rank) != self.rank:
            # A checkpoint written by another rank: not this process's memory.
            log.info("memwatch: checkpoint state of rank %s not loaded on rank %d",
                     restored.rank, self.rank)
            return
        self.findings = restored.findings
        self.warner.warned = restored.warned
        if self.memwatch is not None and self.memwatch.running:
            self._restore(restored)
        else:
            self._pending_state = restored

    def _restore(self, restored: RestoredState) -> None:
        self._pending_state = None
        if restored.train is not None and self.memwatch is not None:
            self.memwatch.load_state_dict(restored.train)

    def hook_state_files(self, *registrars: Callable[[Callable[..., None]], Any]) -> list[Any]:
        """Register this driver's state-file writer and reader with a framework that calls hooks
        with the checkpoint folder as their last argument (Accelerate's ``save_state``/
        ``load_state`` pre-hooks); returns the handles."""
        save, load = registrars
        return [save(lambda *a: self.save_state_file(a[-1])),
                load(lambda *a: self.load_state_file(a[-1]))]

    def state_path(self, folder: str | os.PathLike[str]) -> str:
        name = STATE_FILE if self.rank == 0 else STATE_FILE.replace(".json",
                                                                    f"-rank{self.rank}.json")
        return os.path.join(os.fspath(folder), name)

    def save_state_file(self, folder: str | os.PathLike[str]) -> None:
        """Write this process's state into a checkpoint folder (atomically). Never raises."""
        try:
            path = self.state_path(folder)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.state_dict(), f, allow_nan=False)
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not save its state with the checkpoint (%s: %s)",
                        type(e).__name__, e)

    def load_state_file(self, folder: str | os.PathLike[str]) -> None:
        """Read this process's state from a checkpoint folder, if it has one. Never raises."""
        try:
            path = self.state_path(folder)
            if not os.path.isfile(path):
                log.info("memwatch: %s has no memwatch state; the analysis starts fresh",
                         folder)
                return
            with open(path, encoding="utf-8") as f:
                self.load_state_dict(json.load(f))
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: could not read its state from the checkpoint (%s: %s); the "
                        "analysis starts fresh", type(e).__name__, e)


def _positive_int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if 0 < f < 1e15 else None
