"""Checkpoints: what a session keeps across a restart, so a resumed run's verdicts span it.

:class:`Checkpointer` exports a session's state as plain data (see
:mod:`memwatch.runtime.resume`) and turns a saved state into what the session restores: the
epoch summaries, the findings and the step numbering. It checks everything before anything
changes; the session applies the result (it owns its counters, its timeline and its findings).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary, Timeline

if TYPE_CHECKING:
    from memwatch.session.checker import Checker
    from memwatch.session.sampling import Sampling

log = logging.getLogger("memwatch")

__all__ = ["Checkpointer", "Restored"]


@dataclasses.dataclass(frozen=True)
class Restored:
    """A saved state, checked and ready to apply."""

    epochs: list[EpochSummary]
    findings: list[Finding]
    step_count: int
    epoch: int


class Checkpointer:
    """``state_dict`` / ``load_state_dict`` of one session.

    The state is plain data only (see :mod:`memwatch.runtime.resume`): JSON-serialisable with
    ``allow_nan=False`` and loadable with ``torch.load(weights_only=True)``. It holds the
    timeline's epoch summaries (with their metric names), ``step_count``, ``epoch`` and the
    findings. Restoring remaps the metric columns by name (a metric this run lacks is dropped, a
    new one is NaN in the restored epochs), replays the epochs through the analyzer so
    cross-epoch verdicts span the restart (their findings were reported before it: they are not
    returned again), restores the findings and continues the step numbering. A state given
    before the session started is kept (:attr:`pending`) and applied at start.

    Example::

        >>> import json, memwatch
        >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
        ...     for _ in range(4):
        ...         mw.step()
        ...     _ = mw.end_epoch()
        >>> state = json.loads(json.dumps(mw.state_dict(), allow_nan=False))
        >>> resumed = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp))
        >>> resumed.load_state_dict(state)  # before or after start()
        >>> with resumed:
        ...     resumed.step()
        >>> resumed.step_count, [e.epoch for e in resumed.epochs]
        (5, [0])
    """

    def __init__(self) -> None:
        #: A state given before ``start()``: applied there.
        self.pending: dict[str, Any] | None = None

    def hold(self, state: Any) -> None:
        """Keep ``state`` until the session starts."""
        self.pending = state if isinstance(state, dict) else {"version": None}

    def take_pending(self) -> dict[str, Any] | None:
        state, self.pending = self.pending, None
        return state

    def export(self, timeline: Timeline | None, step_count: int, epoch: int,
               findings: list[Finding]) -> dict[str, Any]:
        """Plain data for a checkpoint (never raises)."""
        from memwatch.runtime.resume import STATE_VERSION, plain, summary_to_state

        empty = {"version": STATE_VERSION, "step_count": int(step_count), "epoch": int(epoch),
                 "epochs": [], "findings": []}
        if timeline is None:
            # Not started yet: a state loaded but not applied is still this session's state.
            return plain(self.pending) if self.pending is not None else empty
        try:
            return {
                "version": STATE_VERSION,
                "step_count": int(step_count),
                "epoch": int(epoch),
                "epochs": [summary_to_state(e) for e in timeline.epochs],
                "findings": [plain(f.to_dict()) for f in findings],
            }
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not export the session state (%s: %s); the checkpoint "
                        "keeps the step count only", type(e).__name__, e)
            return empty

    def read(self, state: Any, timeline: Timeline) -> Restored | None:
        """The state checked against this session's timeline; None (after a warning) when it
        cannot be used: another version, malformed, or given after an epoch closed here."""
        from memwatch.runtime.resume import STATE_VERSION, epochs_from_state

        version = state.get("version") if isinstance(state, dict) else None
        if version != STATE_VERSION:
            log.warning("memwatch: checkpoint state version %r is not one this memwatch reads "
                        "(%d); the analysis starts fresh", version, STATE_VERSION)
            return None
        if timeline.epochs:
            log.warning("memwatch: checkpoint state given after this session closed an epoch; "
                        "not restored (load it before the first epoch end)")
            return None
        try:  # everything is checked before anything changes
            epochs = epochs_from_state(state.get("epochs") or [], timeline.keys)
            findings = [Finding.from_dict(d) for d in state.get("findings") or []]
            step_count = int(state.get("step_count") or 0)
            epoch = int(state.get("epoch") or 0)
            if epochs and epochs[-1].end_step > step_count:
                raise ValueError(f"last epoch ends at step {epochs[-1].end_step}, after the "
                                 f"saved step count {step_count}")
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: checkpoint state not usable (%s: %s); the analysis starts "
                        "fresh", type(e).__name__, e)
            return None
        return Restored(epochs, findings, step_count,
                        max(epoch, epochs[-1].epoch + 1 if epochs else 0))

    def restore(self, state: Any, sampling: Sampling, checker: Checker) -> int | None:
        """Apply ``state`` to a started session's parts; the epoch it continues from, or None
        when it could not be used (nothing changed then)."""
        tl = sampling.timeline
        got = self.read(state, tl) if tl is not None else None
        if got is None or tl is None:
            return None
        tl.restore_epochs(got.epochs)
        checker.keep(got.findings, before=True)
        # One step axis across the restart: the analyzer's slopes and forecasts read it.
        sampling.resume_at(got.step_count)
        checker.replay([e for e in got.epochs if e.bucket_floor is not None])
        log.info("memwatch: resumed from a checkpoint: %d epoch(s), %d finding(s), step %d",
                 len(got.epochs), len(got.findings), sampling.step_count)
        return got.epoch
