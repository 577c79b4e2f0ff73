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

Metric keys: every key of :mod:`memwatch.core.metrics`, plus ``memwatch/recovered_ooms`` (OOMs
that ``find_executable_batch_size`` retried) and ``memwatch/batch_size`` (the batch size it settled
on); ``memwatch/findings_table`` for the trackers that take tables.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from memwatch.core.errors import MemWatchWarning
from memwatch.integrations import _accelerate_loop as loop
from memwatch.integrations import _adapter as ad
from memwatch.integrations import _driver as drv
from memwatch.integrations import _framework as fw
from memwatch.integrations._loggers import AccelerateLog
from memwatch.session import AdapterOptions, MemWatch, Unpack

__all__ = ["STATE_FILE", "AccelerateHook", "MemWatchWarning", "attach"]

STATE_FILE = drv.STATE_FILE
# One hook per Accelerator: attaching again (typically inside a function that
# find_executable_batch_size re-runs with a smaller batch) moves the hook to the new optimizer and
# keeps its timeline, findings and OOM history. Values are weak too: a hook holds its
# accelerator, and a strong value would keep the key alive.
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
    loop.check_accelerator(accelerator)
    ref = _HOOKS.get(accelerator)
    existing = ref() if ref is not None else None
    if existing is not None and existing.attached:
        existing.watch_optimizer(optimizer)
        return existing
    hook = AccelerateHook(accelerator, optimizer, **options)
    hook.start()
    _HOOKS[accelerator] = weakref.ref(hook)
    return hook


class AccelerateHook(ad.Adapter):
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
            ``critical``; any other new leak verdict gets a one-line notice on the ``memwatch``
            logger, other ``info`` findings are only logged.
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
        graceful_stop: when the watchdog says to stop (an OOM forecast within its horizon, or
            critical usage), warn once and set :attr:`should_stop`: your loop saves its state
            (``accelerator.save_state()``) and leaves. Unless you pass ``watchdog=...``, it adds
            ``"stop"`` to the watchdog's ``on_forecast`` and ``on_critical`` actions.
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
        should_stop, stop_reason: the watchdog asked the run to stop, and why.

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
        graceful_stop: bool = False,
        **memwatch_options: Unpack[AdapterOptions],
    ) -> None:
        loop.check_accelerator(accelerator)
        fw.check_choice("epochs", epochs, epochs in ("auto", "manual"), "use 'auto' (prepared "
                         "DataLoaders end epochs) or 'manual' (call hook.end_epoch())")
        fw.check_choice("checkpoint", checkpoint, checkpoint in ("file", "register", None),
                         "use 'file' (memwatch_state.json in each save_state folder), "
                         "'register' (register_for_checkpointing) or None")
        self._d = drv.Driver("attach()", memwatch, memwatch_options, warn=warn,
                             graceful_stop=graceful_stop, adapter=type(self),
                             log_every=(log_every_n_steps, ", e.g. 50."))
        self._d.configure(accelerator.device, getattr(accelerator, "project_dir", None),
                          getattr(accelerator, "num_processes", 1),
                          getattr(accelerator, "process_index", 0))
        self._d.use_loggers([AccelerateLog(accelerator, step, self._d.sinks)])
        self.accelerator, self.step = accelerator, step
        self.epochs, self.checkpoint = epochs, checkpoint
        self._torch_opt = loop.torch_optimizer(accelerator, optimizer)
        self._opt_handle: Any = None
        self._handles: list[Any] = []
        self.batch_size: int | None = None
        self.attached = self._looked_for_febs = False
        self._epochs = ad.LoaderPasses(self._d)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AccelerateHook:
        """Start the MemWatch and install the hooks (:func:`attach` does this)."""
        if self.attached or self._d.start() is None:
            return self
        self.attached = True
        acc = self.accelerator
        if self.checkpoint == "register" and not any(o is self for o in acc._custom_objects):
            acc.register_for_checkpointing(self)
        elif self.checkpoint == "file":  # on every process: this process's state file
            self._handles = self._d.hook_state_files(acc.register_save_state_pre_hook,
                                                     acc.register_load_state_pre_hook)
        self.watch_optimizer(self._torch_opt, force=True)
        return self

    def detach(self) -> None:
        """Remove every hook this installed (optimizer, DataLoaders, checkpoints) and close the
        MemWatch. Idempotent; never raises. ``findings`` and ``memwatch`` stay readable."""
        self.attached = False
        for handle in [self._opt_handle, *self._handles]:
            if handle is not None:
                handle.remove()
        self._handles, self._opt_handle = [], None
        self._epochs.release()
        self._d.close()
        mine = _HOOKS.get(self.accelerator)
        if mine is not None and mine() is self:
            del _HOOKS[self.accelerator]

    close = detach  # leaving ``with attach(...) as hook:`` detaches too

    def __enter__(self) -> AccelerateHook:
        return self.start()

    def watch_optimizer(self, optimizer: Any, force: bool = False) -> None:
        """Sample on ``optimizer``'s steps from now on instead (the hook on the old one goes)."""
        opt = loop.torch_optimizer(self.accelerator, optimizer)
        if opt is self._torch_opt and self._opt_handle is not None and not force:
            return
        if self._opt_handle is not None:
            self._opt_handle.remove()
        self._torch_opt = opt
        if self.attached:
            self._opt_handle = opt.register_step_post_hook(self._on_optimizer_step)
            self._watch_loaders()

    def watch_dataloader(self, dataloader: Any) -> None:
        """End epochs when ``dataloader`` is exhausted too (prepared loaders are found by
        themselves; use this for one made later by ``accelerator.skip_first_batches``)."""
        if self.attached:
            self._epochs.watch(dataloader, self._iterating(dataloader))

    def end_epoch(self) -> list[Any]:
        """End the epoch now (for loops without epochs); returns the new findings. Without an
        optimizer step since the last epoch end it does nothing."""
        return self._epochs.end_epoch()

    # ------------------------------------------------------------------ translation
    @fw.guarded("the per-step hook", then="detach")
    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Runs inside optimizer.step(): only when the inner torch step really ran (not during
        # accumulation, not when a GradScaler skipped an overflowing step).
        self._watch_loaders()
        if self._d.has_pending_oom() or not self._looked_for_febs:
            self._looked_for_febs = True
            # Stepping again after an OOM inside find_executable_batch_size: it caught the OOM
            # (one per smaller batch tried: the device's counter says how many) and retried.
            size = fw.from_caller_frames(loop.febs_batch_size, depth=200)
            self.batch_size = size if size is not None else self.batch_size
            if size is not None and self._d.has_pending_oom():
                self._d.recovered_oom(new_batch_size=self.batch_size, batch_key="batch_size")
        self._d.step()
        if self._d.wants_stop():
            self._d.stopping("hook.should_stop is True: save your state and leave the loop")

    def _watch_loaders(self) -> None:
        if self.epochs == "auto":  # loaders prepared since the last step
            self._epochs.watch_list(getattr(self.accelerator, "_dataloaders", []),
                                    self._iterating)

    def _iterating(self, dl: Any) -> bool:
        # Found mid-pass (prepared after attach, seen at the first step of its pass): its
        # begin() already ran.
        return any(r is dl for r in self.accelerator.gradient_state.dataloader_references)
