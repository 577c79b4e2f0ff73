"""Hugging Face Accelerate: :func:`attach` watches a custom training loop with one line.

Accelerate users write their own loops, so there is no callback system to plug into. The hook
plugs into the two things every Accelerate loop has:

* the **torch optimizer** inside the ``AcceleratedOptimizer``: a step post-hook
  (``Optimizer.register_step_post_hook``) takes one sample per *real* optimizer step. Under
  gradient accumulation the wrapper calls the inner ``step()`` only when
  ``accelerator.sync_gradients`` is true, and with a ``GradScaler`` (fp16) the scaler does not call
  it when gradients overflowed (``optimizer.step_was_skipped``): neither counts as a step, because
  neither runs the post-hook.
* the **prepared DataLoaders**: an epoch ends when one of them is exhausted after optimizer steps
  happened during its pass (its ``end()``, which Accelerate calls when the iteration stops, is
  observed on the instance). Evaluation loaders, during which no optimizer step runs, do not end
  training epochs. Loops without epochs call :meth:`AccelerateHook.end_epoch` themselves.

Metrics go through ``accelerator.log`` (every tracker configured with ``log_with=...`` gets them),
from the main process only; every process samples and judges its own memory.

Metric keys (see :mod:`memwatch.core.metrics` for the full rules):

==================================================  ==============================================
key                                                 meaning
==================================================  ==============================================
``memwatch/host.rss_gib``                           this process's resident memory (per step)
``memwatch/host.uss_gib``, ``host.pss_gib``         private / proportional memory (background)
``memwatch/device.allocated_gib`` ...               accelerator allocator counters (CUDA/MPS)
``memwatch/workers.count``, ``workers.uss_gib``     DataLoader workers
``memwatch/findings/count``                         new findings at this epoch end
``memwatch/findings/<kind>``                        new findings of that kind
``memwatch/findings/<kind>.<metric>_mib_per_step``  growth rate of a finding
``memwatch/recovered_ooms``                         OOMs that find_executable_batch_size retried
``memwatch/batch_size``                             the batch size it settled on
``memwatch/oom``                                    1 when a run died and left a bundle
==================================================  ==============================================
"""

from __future__ import annotations

import json
import logging
import os
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

try:
    import accelerate.utils.memory as _acc_memory
    from accelerate.optimizer import AcceleratedOptimizer
except ImportError as _e:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "memwatch.integrations.accelerate needs Hugging Face Accelerate; install it with "
        "pip install 'memwatch[accelerate]'"
    ) from _e

from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.integrations._adapter import (
    FindingWarner,
    adapter_state,
    build_memwatch,
    check_given,
    check_log_every,
    read_adapter_state,
    session_options,
)
from memwatch.core.metrics import (
    FINDING_COLUMNS,
    PREFIX,
    finding_row,
    findings_metrics,
    to_log_metrics,
)
from memwatch.session import MemWatch

__all__ = ["AccelerateHook", "MemWatchWarning", "attach"]

log = logging.getLogger("memwatch")

_WARN_SEVERITIES = ("warning", "critical")
_MAX_FINDINGS = 1000
_MAX_RECOVERED = 100
# find_executable_batch_size's retry loop is the nested function ``decorator`` of this file; its
# frame (alive while the retried function runs) holds the current ``batch_size``.
_FEBS_FILE = os.path.normcase(os.path.abspath(_acc_memory.__file__))
_MARK = "_memwatch_hook_wrapper"
#: What ``checkpoint="file"`` writes into every ``save_state`` folder (``-rank<N>`` for others).
STATE_FILE = "memwatch_state.json"
_CHECKPOINT_CHOICES = ("file", "register", None)

# One hook per Accelerator: attaching again (typically inside a function that
# find_executable_batch_size re-runs with a smaller batch) moves the hook to the new optimizer and
# keeps its timeline, findings and OOM history.
# Values are weak too: a hook holds its accelerator, and a strong value would keep the key alive.
_HOOKS: weakref.WeakKeyDictionary[Any, weakref.ref[AccelerateHook]] = weakref.WeakKeyDictionary()


def attach(accelerator: Any, optimizer: Any = None, **options: Any) -> AccelerateHook:
    """Watch memory in a custom Accelerate loop; returns the started :class:`AccelerateHook`.

    Args:
        accelerator: the ``accelerate.Accelerator``.
        optimizer: the prepared optimizer (``AcceleratedOptimizer``) or the torch optimizer inside
            it; ``None`` takes the only optimizer prepared so far.
        **options: :class:`AccelerateHook` options (``log_every_n_steps``, ``step``, ``warn``,
            ``epochs``, ``checkpoint``, ``memwatch``) and :class:`memwatch.MemWatch` options
            (``device``, ``out_dir``, ``census``...).

    Calling it again for the same accelerator returns the same hook, moved to ``optimizer``
    (options are only read the first time).

    Example::

        >>> import torch
        >>> from accelerate import Accelerator
        >>> from memwatch.integrations.accelerate import attach
        >>> accelerator = Accelerator(cpu=True)
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
        >>> model, opt, data = accelerator.prepare(model, opt, data)
        >>> hook = attach(accelerator, opt, workers=False, out_dir=str(tmp))
        >>> for x in data:
        ...     accelerator.backward(model(x).sum())
        ...     opt.step()
        ...     opt.zero_grad()
        >>> hook.memwatch.step_count, hook.memwatch.epoch
        (4, 1)
        >>> hook.detach()
    """
    _check_accelerator(accelerator)
    ref = _HOOKS.get(accelerator)
    existing = ref() if ref is not None else None
    if existing is not None and existing.attached:
        existing.watch_optimizer(optimizer)
        return existing
    hook = AccelerateHook(accelerator, optimizer, **options)
    hook.start()
    _HOOKS[accelerator] = weakref.ref(hook)
    return hook


class AccelerateHook:
    """Samples memory once per real optimizer step of an Accelerate loop and judges it per epoch.

    Create it with :func:`attach` (which also starts it).

    Args:
        accelerator: the ``accelerate.Accelerator``.
        optimizer: the prepared optimizer or its inner torch optimizer (see :func:`attach`).
        memwatch: a :class:`memwatch.MemWatch` to drive instead of creating one (then pass no
            other MemWatch option).
        log_every_n_steps: log the latest sample through ``accelerator.log`` every N optimizer
            steps (main process only; nothing is built when no tracker is configured).
        step: the ``step=`` given to ``accelerator.log``: ``"optimizer"`` (memwatch's count of
            optimizer steps: the ``completed_steps`` most loops log at), ``None`` (each tracker
            uses its own counter) or a callable returning the step (your loop's own axis; W&B
            drops rows logged at a step lower than one already logged).
        warn: emit a :class:`MemWatchWarning` once per new finding of severity ``warning`` or
            ``critical``; ``info`` findings are only logged.
        epochs: ``"auto"`` (an epoch ends when a prepared DataLoader is exhausted after optimizer
            steps) or ``"manual"`` (only :meth:`end_epoch` ends one).
        checkpoint: how memwatch's state (epoch summaries, step count, findings) travels with
            ``accelerator.save_state()``/``load_state()``, so verdicts span a restart:
            ``"file"`` (default: save/load pre-hooks write and read ``memwatch_state.json`` in
            the checkpoint folder, one per process; a checkpoint without it resumes fresh;
            attach before ``load_state``), ``"register"``
            (``accelerator.register_for_checkpointing(hook)``: saved as
            ``custom_checkpoint_<i>.pkl`` by the main process only; the registration order
            must be the same when resuming, and Accelerate refuses to load a folder whose count
            of custom objects differs) or ``None``.
        **memwatch_options: passed to :class:`memwatch.MemWatch`. ``device`` defaults to the
            accelerator's device and ``out_dir`` to ``<project_dir or cwd>/memwatch`` (plus
            ``/rank<N>`` when several processes run).

    Attributes:
        memwatch: the driven :class:`memwatch.MemWatch`.
        findings: every finding so far (the latest 1,000).
        bundle_path: the flight-recorder bundle written for a failure handled by the hook.
        recovered_ooms: each time the loop stepped again after ``find_executable_batch_size``
            caught OOMs and retried: a dict with ``step``, ``ooms`` (how many it caught since the
            previous step: one per smaller batch tried), ``batch_size`` (the one that runs now)
            and ``tried_to_allocate``. No bundle is written for these OOMs.
        recovered_oom_count: the total of ``ooms`` over ``recovered_ooms``.
        batch_size: the batch size ``find_executable_batch_size`` runs with (``None`` outside it).

    Example::

        >>> import torch
        >>> from accelerate import Accelerator
        >>> from memwatch.integrations.accelerate import attach
        >>> accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
        >>> model, opt, data = accelerator.prepare(model, opt, data)
        >>> with attach(accelerator, opt, workers=False, out_dir=str(tmp)) as hook:
        ...     for x in data:
        ...         with accelerator.accumulate(model):
        ...             accelerator.backward(model(x).sum())
        ...             opt.step()
        ...             opt.zero_grad()
        >>> hook.memwatch.step_count  # 4 batches, 2 real optimizer steps
        2
    """

    def __init__(
        self,
        accelerator: Any,
        optimizer: Any = None,
        *,
        memwatch: MemWatch | None = None,
        log_every_n_steps: int = 50,
        step: str | Callable[[], int] | None = "optimizer",
        warn: bool = True,
        epochs: str = "auto",
        checkpoint: str | None = "file",
        **memwatch_options: Any,
    ) -> None:
        _check_accelerator(accelerator)
        check_given("attach()", memwatch, memwatch_options)
        check_log_every(log_every_n_steps, ", e.g. 50.")
        if not (step is None or step == "optimizer" or callable(step)):
            raise ConfigError(
                f"step={step!r}: use 'optimizer', None, or a callable returning your loop's step."
            )
        if epochs not in ("auto", "manual"):
            raise ConfigError(f"epochs={epochs!r}: use 'auto' (prepared DataLoaders end epochs) "
                              "or 'manual' (call hook.end_epoch()).")
        if checkpoint not in _CHECKPOINT_CHOICES:
            raise ConfigError(f"checkpoint={checkpoint!r}: use 'file' (memwatch_state.json in "
                              "each save_state folder), 'register' (register_for_checkpointing)"
                              " or None (no state in checkpoints).")
        self.checkpoint = checkpoint
        self._checkpoint_handles: list[Any] = []
        self.accelerator = accelerator
        self._torch_opt = _torch_optimizer(accelerator, optimizer)
        if memwatch is None:
            memwatch = build_memwatch("attach()", session_options(
                None, memwatch_options, _device_of(accelerator), _default_out_dir(accelerator),
                for_eval=False))
        self.memwatch: MemWatch = memwatch
        self.log_every_n_steps = log_every_n_steps
        self.step = step
        self.warn = bool(warn)
        self.epochs = epochs
        self.findings: list[Finding] = []
        self.bundle_path: Path | None = None
        self.recovered_ooms: list[dict[str, Any]] = []
        self.recovered_oom_count = 0
        self._ooms_at_start: float | None = None
        self.batch_size: int | None = None
        self._is_main = bool(getattr(accelerator, "is_main_process", True))
        self._world = int(getattr(accelerator, "num_processes", 1) or 1)
        self._rank = int(getattr(accelerator, "process_index", 0) or 0)
        self._handle: Any = None
        self._loaders: list[weakref.ref[Any]] = []
        self._loader_list_id = 0
        self._loader_count = -1
        self._pass_start: dict[int, int] = {}
        self._last_epoch_step = 0
        self._warner = FindingWarner()
        self._logging_broken = False
        self._looked_for_febs = False
        self.attached = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AccelerateHook:
        """Start the MemWatch and install the hooks (:func:`attach` does this)."""
        if self.attached:
            return self
        mw = self.memwatch
        try:
            mw.start()
        except Exception as e:  # noqa: BLE001 - a broken watcher must not stop training
            log.warning("memwatch: could not start (%s: %s); training continues unwatched",
                        type(e).__name__, e)
            return self
        self.attached = True
        self._ooms_at_start = _device_ooms(mw)
        self._hook_checkpoints()
        self._hook_optimizer(self._torch_opt)
        if self.epochs == "auto":
            self._watch_new_loaders()
        return self

    def detach(self) -> None:
        """Remove every hook this installed (optimizer, DataLoaders) and close the MemWatch.

        Idempotent; never raises. ``findings`` and ``memwatch`` stay readable."""
        self.attached = False
        if self._handle is not None:
            try:
                self._handle.remove()
            except Exception:  # noqa: BLE001
                pass
            self._handle = None
        for loader_ref in self._loaders:
            dl = loader_ref()
            if dl is not None:
                _unwrap_loader(dl)
        self._loaders.clear()
        self._pass_start.clear()
        for handle in self._checkpoint_handles:
            try:
                handle.remove()
            except Exception:  # noqa: BLE001
                pass
        self._checkpoint_handles.clear()
        self.memwatch.close()  # idempotent, never raises
        mine = _HOOKS.get(self.accelerator)
        if mine is not None and mine() is self:
            del _HOOKS[self.accelerator]

    def __enter__(self) -> AccelerateHook:
        return self.start()

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.handle_exception(exc)
        self.detach()

    def watch_optimizer(self, optimizer: Any) -> None:
        """Sample on ``optimizer``'s steps from now on instead (the hook on the old one goes)."""
        opt = _torch_optimizer(self.accelerator, optimizer)
        if opt is self._torch_opt and self._handle is not None:
            return
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._torch_opt = opt
        if self.attached:
            self._hook_optimizer(opt)
            if self.epochs == "auto":
                self._watch_new_loaders()

    def watch_dataloader(self, dataloader: Any) -> None:
        """End epochs when ``dataloader`` is exhausted too (prepared loaders are found by
        themselves; use this for one made later by ``accelerator.skip_first_batches``)."""
        if self.attached:
            self._wrap(dataloader)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This hook's state for a checkpoint: findings, warnings given, and the session's
        :meth:`memwatch.MemWatch.state_dict` (plain data: ``torch.load(weights_only=True)``
        reads it). Never raises."""
        state = adapter_state(self.memwatch, self.findings, self._warner)
        state["rank"] = self._rank
        return state

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict` saved before a restart (before the first epoch end
        of this run). A state that cannot be used logs a warning; never raises."""
        if isinstance(state, dict) and state.get("rank", self._rank) != self._rank:
            # "register" saves the main process's state only: not this process's memory.
            log.info("memwatch: checkpoint state of rank %s not loaded on rank %d",
                     state.get("rank"), self._rank)
            return
        restored = read_adapter_state(state)
        if restored is None:
            return
        self.findings = restored.findings
        self._warner.warned = restored.warned
        if restored.train is not None:
            self.memwatch.load_state_dict(restored.train)
        self._last_epoch_step = max(self._last_epoch_step, self.memwatch.step_count)

    def _hook_checkpoints(self) -> None:
        acc = self.accelerator
        try:
            if self.checkpoint == "register":
                if not any(o is self for o in getattr(acc, "_custom_objects", ())):
                    acc.register_for_checkpointing(self)
            elif self.checkpoint == "file":
                self._checkpoint_handles = [
                    acc.register_save_state_pre_hook(self._on_save_state),
                    acc.register_load_state_pre_hook(self._on_load_state),
                ]
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: checkpoints will not carry memwatch's state (%s: %s)",
                        type(e).__name__, e)

    def _state_path(self, folder: Any) -> str:
        name = STATE_FILE if self._rank == 0 else STATE_FILE.replace(".json",
                                                                     f"-rank{self._rank}.json")
        return os.path.join(os.fspath(folder), name)

    def _on_save_state(self, models: Any, weights: Any, output_dir: Any) -> None:
        # Accelerate's save_state pre-hook, on every process, once output_dir exists.
        try:
            path = self._state_path(output_dir)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.state_dict(), f, allow_nan=False)
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not save its state with the checkpoint (%s: %s)",
                        type(e).__name__, e)

    def _on_load_state(self, models: Any, input_dir: Any) -> None:
        # Accelerate's load_state pre-hook: the folder being resumed from.
        try:
            path = self._state_path(input_dir)
            if not os.path.isfile(path):
                log.info("memwatch: %s has no memwatch state; the analysis starts fresh",
                         input_dir)
                return
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            self.load_state_dict(state)
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: could not read its state from the checkpoint (%s: %s); the "
                        "analysis starts fresh", type(e).__name__, e)

    # ------------------------------------------------------------------ hot path
    def _hook_optimizer(self, opt: Any) -> None:
        self._handle = opt.register_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Runs inside optimizer.step(): only when the inner torch step really ran (not during
        # accumulation, not when a GradScaler skipped an overflowing step). Never raises.
        mw = self.memwatch
        try:
            if self.epochs == "auto":
                loaders = getattr(self.accelerator, "_dataloaders", ())
                if id(loaders) != self._loader_list_id or len(loaders) != self._loader_count:
                    self._watch_new_loaders()
            rec = mw.recorder
            recovered = None
            if rec is not None and rec._pending is not None:
                recovered = self._claim_recovered(rec)  # an OOM happened since the last step
            elif not self._looked_for_febs:
                self._looked_for_febs = True
                febs = _febs_frame()
                if febs is not None:
                    self.batch_size = _frame_batch_size(febs)
            mw.step()
            if recovered is not None:
                self._record_recovered(*recovered)
            n = mw.step_count
            if n % self.log_every_n_steps == 0 and self._is_main and self.accelerator.trackers:
                self._log(to_log_metrics(mw.latest()), n)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: per-step hook failed (%s: %s); detaching",
                        type(e).__name__, e)
            self.detach()

    # ------------------------------------------------------------------ epochs
    def _watch_new_loaders(self) -> None:
        loaders = getattr(self.accelerator, "_dataloaders", [])
        self._loader_list_id = id(loaders)
        self._loader_count = len(loaders)
        for dl in list(loaders):
            self._wrap(dl)

    def _wrap(self, dl: Any) -> None:
        if any(r() is dl for r in self._loaders):
            return
        if _wrap_loader(dl, self):
            self._loaders = [r for r in self._loaders if r() is not None]
            self._loaders.append(weakref.ref(dl))
            # Found mid-pass (prepared after attach, seen at the first step of its pass): its
            # begin() already ran, so this pass starts now.
            try:
                iterating = self.accelerator.gradient_state.dataloader_references
            except Exception:  # noqa: BLE001
                iterating = []
            if any(r is dl for r in iterating):
                self._pass_start[id(dl)] = self.memwatch.step_count

    def _loader_begin(self, dl: Any) -> None:
        self._pass_start[id(dl)] = self.memwatch.step_count

    def _loader_end(self, dl: Any) -> None:
        start = self._pass_start.pop(id(dl), None)
        if start is None or not self.attached:
            return
        # Optimizer steps ran during this pass (so it was a training loader, not evaluation) and
        # since the last epoch end (so a manual end_epoch() just before is not doubled).
        if self.memwatch.step_count > max(start, self._last_epoch_step):
            self._end_epoch()

    def end_epoch(self) -> list[Finding]:
        """End the epoch now (for loops without epochs); returns the new findings.

        Without an optimizer step since the last epoch end it does nothing, so calling it right
        after a DataLoader pass that already ended the epoch is harmless."""
        return self._end_epoch()

    def _end_epoch(self) -> list[Finding]:
        mw = self.memwatch
        if not mw.running or mw.step_count <= self._last_epoch_step:
            return []
        new: list[Finding] = []
        try:
            self._last_epoch_step = mw.step_count
            new = mw.end_epoch()  # never raises (the session disables what fails)
            self.findings.extend(new)
            del self.findings[:-_MAX_FINDINGS]  # bounded, like the session's own list
            if self._is_main and self.accelerator.trackers:
                self._log(findings_metrics(new), mw.step_count)
                if mw.rank_summaries:
                    # After the epoch-end exchange, the main process has every rank's figures.
                    from memwatch.runtime.exchange import rank_log_metrics

                    self._log(rank_log_metrics(mw.rank_summaries, PREFIX), mw.step_count)
                if new:
                    self._log_table(new, mw.step_count)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: epoch end failed (%s: %s)", type(e).__name__, e)
        if self.warn:
            for f in new:
                # Info findings (a warm-up that levelled off) are logged, not warned about: a
                # clean run stays silent. (Outside the try: a warnings filter set to "error" is
                # the user's choice to have them raised.)
                if f.severity in _WARN_SEVERITIES:
                    self._warn_once(f)
        return new

    def _warn_once(self, f: Finding) -> None:
        rank = f" [rank {self._rank}]" if self._world > 1 else ""
        self._warner.warn(f, rank, stacklevel=3)

    # ------------------------------------------------------------------ logging
    def _log_step(self, n: int) -> int | None:
        if self.step == "optimizer":
            return n
        if callable(self.step):
            return int(self.step())
        return None

    def _log(self, metrics: dict[str, float], n: int) -> None:
        if not metrics or self._logging_broken:
            return
        try:
            self.accelerator.log(metrics, step=self._log_step(n))
        except Exception as e:  # noqa: BLE001 - a tracker failure must not stop training
            self._logging_broken = True
            log.warning("memwatch: accelerator.log disabled after an error (%s: %s)",
                        type(e).__name__, e)

    def _log_table(self, findings: list[Finding], n: int) -> None:
        rows = [finding_row(f) for f in findings]
        for tracker in list(self.accelerator.trackers):
            log_table = getattr(tracker, "log_table", None)
            if not callable(log_table):
                continue
            try:
                log_table(f"{PREFIX}/findings_table", columns=list(FINDING_COLUMNS), data=rows,
                          step=self._log_step(n))
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: could not log the findings table to %s (%s: %s)",
                            getattr(tracker, "name", type(tracker).__name__),
                            type(e).__name__, e)

    # ------------------------------------------------------------------ failures
    def handle_exception(self, exc: BaseException) -> Path | None:
        """Record a failure your loop caught (a bundle when configured for its class); the
        recorder does this by itself for exceptions that end the program. Never raises."""
        try:
            path = self.memwatch.handle_exception(exc)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not record the failure (%s: %s)", type(e).__name__, e)
            return None
        if path is not None:
            self.bundle_path = Path(path)
            if self._is_main and self.accelerator.trackers:
                self._log({f"{PREFIX}/oom": 1.0}, self.memwatch.step_count)
        return path

    def _claim_recovered(self, rec: Any) -> tuple[Any, int | None, float | None] | None:
        """A pre-unwind OOM capture nobody claimed, and the loop is stepping again: if we run
        inside find_executable_batch_size, it caught that OOM and retried with a smaller batch,
        so the capture is claimed (no bundle). Otherwise the recorder flushes it as usual."""
        febs = _febs_frame()
        if febs is None:
            return None
        take = getattr(rec, "take_pending", None)
        cap = take() if callable(take) else _claim_pending(rec)
        if cap is None:
            return None
        before = self.memwatch.latest().get("device.ooms", self._ooms_at_start)
        return cap, _frame_batch_size(febs), before

    def _record_recovered(self, cap: Any, batch_size: int | None, before: float | None) -> None:
        mw = self.memwatch
        self.batch_size = batch_size
        # Each retry's OOM replaced the previous one's capture; the device's OOM counter says how
        # many there were since the last sample.
        after = mw.latest().get("device.ooms")
        ooms = 1
        if before is not None and after is not None and after - before >= 1:
            ooms = int(after - before)
        self.recovered_oom_count += ooms
        observer = getattr(cap, "observer", None) or {}
        event = {"step": mw.step_count, "ooms": ooms, "batch_size": batch_size,
                 "tried_to_allocate": observer.get("tried_to_allocate")}
        self.recovered_ooms.append(event)
        del self.recovered_ooms[:-_MAX_RECOVERED]
        log.info("memwatch: find_executable_batch_size recovered from %d OOM(s); batch size is "
                 "now %s (no bundle written)", ooms, batch_size)
        if self._is_main and self.accelerator.trackers:
            values = {f"{PREFIX}/recovered_ooms": float(self.recovered_oom_count)}
            if batch_size is not None:
                values[f"{PREFIX}/batch_size"] = float(batch_size)
            self._log(values, mw.step_count)


# ---------------------------------------------------------------------- helpers
def _check_accelerator(accelerator: Any) -> None:
    if not hasattr(accelerator, "gradient_state") or not hasattr(accelerator, "log"):
        raise ConfigError(
            f"accelerator={accelerator!r} is not an accelerate.Accelerator; pass the one "
            "your loop prepared its model and optimizer with."
        )


def _torch_optimizer(accelerator: Any, optimizer: Any) -> Any:
    """The torch optimizer that really steps (an AcceleratedOptimizer does not take hooks)."""
    if optimizer is None:
        prepared = list(getattr(accelerator, "_optimizers", []))
        if len(prepared) != 1:
            raise ConfigError(
                f"attach(accelerator) found {len(prepared)} prepared optimizers; pass the one "
                "that steps once per training step: attach(accelerator, optimizer)."
            )
        optimizer = prepared[0]
    inner = optimizer
    # AcceleratedOptimizer (and DeepSpeed's wrapper inside it) keep the real one in .optimizer.
    for _ in range(3):
        if isinstance(inner, AcceleratedOptimizer):
            inner = inner.optimizer
        else:
            break
    if not callable(getattr(inner, "register_step_post_hook", None)):
        raise ConfigError(
            f"optimizer={optimizer!r} has no register_step_post_hook(); pass a torch.optim "
            "optimizer (torch >= 2.0) or the AcceleratedOptimizer wrapping one."
        )
    return inner


def _device_of(accelerator: Any) -> str:
    dev = getattr(accelerator, "device", None)
    kind = getattr(dev, "type", "cpu")
    if kind == "cuda":
        idx = getattr(dev, "index", None)
        return f"cuda:{idx}" if idx is not None else "cuda"
    if kind == "mps":
        return "mps"
    return "cpu"  # CPU, and devices memwatch has no probe for (XLA, NPU...): host memory only


def _default_out_dir(accelerator: Any) -> str:
    root = getattr(accelerator, "project_dir", None) or os.getcwd()
    out = os.path.join(os.fspath(root), "memwatch")
    if int(getattr(accelerator, "num_processes", 1) or 1) > 1:
        out = os.path.join(out, f"rank{getattr(accelerator, 'process_index', 0)}")
    return out


def _wrap_loader(dl: Any, hook: AccelerateHook) -> bool:
    """Observe a prepared loader's pass: Accelerate calls ``begin()`` when iteration starts and
    ``end()`` when it stops. Instance attributes shadow the class's methods, so this touches
    neither the class nor other loaders, and :func:`_unwrap_loader` restores it exactly."""
    cls = type(dl)  # not dl.__class__: Accelerate's loaders report the wrapped DataLoader class
    if not (callable(getattr(cls, "begin", None)) and callable(getattr(cls, "end", None))):
        return False  # not an Accelerate-prepared loader: nothing tells us when it ends
    inst = vars(dl)
    if getattr(inst.get("end"), _MARK, False):
        return False  # wrapped by another hook
    ref = weakref.ref(hook)
    orig_begin = cls.begin.__get__(dl, cls)
    orig_end = cls.end.__get__(dl, cls)

    def begin() -> None:
        orig_begin()
        h = ref()
        if h is not None:
            h._loader_begin(dl)

    def end() -> None:
        orig_end()
        h = ref()
        if h is not None:
            h._loader_end(dl)

    setattr(begin, _MARK, True)
    setattr(end, _MARK, True)
    inst["begin"] = begin
    inst["end"] = end
    return True


def _unwrap_loader(dl: Any) -> None:
    inst = vars(dl)
    for name in ("begin", "end"):
        if getattr(inst.get(name), _MARK, False):
            del inst[name]


def _device_ooms(mw: MemWatch) -> float | None:
    """The device's OOM counter now (before the first sample exists), if it has one."""
    dev = mw.device
    if dev is None or "device.ooms" not in dev.fast_keys:
        return None
    try:
        return float(dev.read_fast()[list(dev.fast_keys).index("device.ooms")])
    except Exception:  # noqa: BLE001
        return None


def _febs_frame() -> FrameType | None:
    """The frame of find_executable_batch_size's retry loop, if we are running inside one."""
    f: FrameType | None = sys._getframe(1)
    for _ in range(200):
        if f is None:
            return None
        code = f.f_code
        if code.co_name == "decorator" and os.path.normcase(code.co_filename) == _FEBS_FILE:
            return f
        f = f.f_back
    return None


def _frame_batch_size(frame: FrameType) -> int | None:
    try:
        value = frame.f_locals.get("batch_size")
    except Exception:  # noqa: BLE001
        return None
    return int(value) if isinstance(value, int) else None


def _claim_pending(rec: Any) -> Any:
    # For a recorder without take_pending(): the same claim, done here.
    pend = getattr(rec, "_pending", None)
    if pend is None or getattr(pend, "claimed", False):
        return None
    pend.claimed = True
    rec._pending = None
    return pend

