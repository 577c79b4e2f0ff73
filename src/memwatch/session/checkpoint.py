"""Checkpoints: what a session keeps across a restart, so a resumed run's verdicts span it.

:class:`Checkpointing` is the part of :class:`memwatch.MemWatch` that saves and restores its
state (plain data, see :mod:`memwatch.runtime.resume`) and replays restored epochs through the
analyzer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from memwatch.analysis.context import CheckContext
from memwatch.core.findings import Finding, Origin
from memwatch.session.config import WatchConfig
from memwatch.timeline import EpochSummary, Timeline

log = logging.getLogger("memwatch")

__all__ = ["MAX_FINDINGS", "Checkpointing"]

#: ``MemWatch.findings`` keeps at most this many (the most recent).
MAX_FINDINGS = 1000


class Checkpointing:
    """``state_dict`` / ``load_state_dict`` of :class:`memwatch.MemWatch` (a mixin)."""

    # What this part reads of the session (MemWatch defines them).
    config: WatchConfig
    timeline: Timeline | None
    findings: list[Finding]
    step_count: int
    epoch: int
    analyzer: Any
    disabled: dict[str, str]
    total_steps: int | None
    device: Any
    _pending_state: dict[str, Any] | None
    _running: bool

    def limits(self) -> dict[str, float]:
        raise NotImplementedError  # MemWatch.limits

    def _plan(self) -> None:
        raise NotImplementedError  # MemWatch._plan

    def _start_analyzer(self) -> None:
        raise NotImplementedError  # MemWatch._start_analyzer

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this session, so a resumed run's verdicts span the restart.

        Plain data only (see :mod:`memwatch.runtime.resume`): JSON-serialisable with
        ``allow_nan=False`` and loadable with ``torch.load(weights_only=True)``. Holds the
        timeline's epoch summaries (with their metric names), ``step_count``, ``epoch`` and
        :attr:`findings`. Never raises.

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
        from memwatch.runtime.resume import STATE_VERSION, plain, summary_to_state

        empty = {"version": STATE_VERSION, "step_count": int(self.step_count),
                 "epoch": int(self.epoch), "epochs": [], "findings": []}
        if self.timeline is None:
            # Not started yet: a state loaded but not applied is still this session's state.
            return plain(self._pending_state) if self._pending_state is not None else empty
        try:
            return {
                "version": STATE_VERSION,
                "step_count": int(self.step_count),
                "epoch": int(self.epoch),
                "epochs": [summary_to_state(e) for e in self.timeline.epochs],
                "findings": [plain(f.to_dict()) for f in self.findings],
            }
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not export the session state (%s: %s); the checkpoint "
                        "keeps the step count only", type(e).__name__, e)
            return empty

    def load_state_dict(self, state: Any) -> None:
        """Continue from a :meth:`state_dict` saved before a restart.

        Works before ``start()`` (the state is applied there) or after it, as long as this
        session has not closed an epoch yet. Restores the epoch summaries into the timeline
        (metric columns remapped by name: a metric this run lacks is dropped, a new one is NaN
        in the restored epochs), replays them through the analyzer so cross-epoch verdicts span
        the restart (their findings were reported before it: they are not returned again),
        restores :attr:`findings` and continues the step numbering. A state that cannot be used
        (another version, malformed) logs a warning and the session starts fresh; this never
        raises.
        """
        if self.timeline is None:
            self._pending_state = state if isinstance(state, dict) else {"version": None}
            return
        self._apply_state(state)

    def _apply_state(self, state: Any) -> None:
        from memwatch.runtime.resume import STATE_VERSION, epochs_from_state

        tl = self.timeline
        if tl is None:
            return
        version = state.get("version") if isinstance(state, dict) else None
        if version != STATE_VERSION:
            log.warning("memwatch: checkpoint state version %r is not one this memwatch reads "
                        "(%d); the analysis starts fresh", version, STATE_VERSION)
            return
        if tl.epochs:
            log.warning("memwatch: checkpoint state given after this session closed an epoch; "
                        "not restored (load it before the first epoch end)")
            return
        try:  # everything is checked before anything changes
            epochs = epochs_from_state(state.get("epochs") or [], tl.keys)
            findings = [Finding.from_dict(d) for d in state.get("findings") or []]
            step_count = int(state.get("step_count") or 0)
            epoch = int(state.get("epoch") or 0)
            if epochs and epochs[-1].end_step > step_count:
                raise ValueError(f"last epoch ends at step {epochs[-1].end_step}, after the "
                                 f"saved step count {step_count}")
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: checkpoint state not usable (%s: %s); the analysis starts "
                        "fresh", type(e).__name__, e)
            return
        tl.restore_epochs(epochs)
        self.findings = findings + self.findings
        del self.findings[: max(len(self.findings) - MAX_FINDINGS, 0)]
        # One step axis across the restart: the analyzer's slopes and forecasts read it.
        self.step_count = max(self.step_count, step_count)
        self.epoch = max(self.epoch, epoch, epochs[-1].epoch + 1 if epochs else 0)
        self._replay(epochs)
        if self._running:  # the periodic work was scheduled from the old step count
            self._plan()
        log.info("memwatch: resumed from a checkpoint: %d epoch(s), %d finding(s), step %d",
                 len(epochs), len(findings), self.step_count)

    def _replay(self, epochs: Sequence[EpochSummary]) -> None:
        """Feed restored epochs to the analyzer (its per-metric history and the findings it
        reports once); what it finds is dropped: it was reported before the restart."""
        analyzer = self.analyzer
        detailed = [e for e in epochs if e.bucket_floor is not None]  # what a verdict reads
        if analyzer is None or "analyzer" in self.disabled or not detailed:
            return
        try:
            for i, e in enumerate(detailed):
                # A census counts the objects alive now: taken once, at the last restored epoch,
                # it is the baseline the first check after the restart compares with, so it is
                # taken whatever "auto" would decide (a large heap, an epoch that looked flat):
                # without it the first verdict after a restart would wait one more epoch. The
                # allocation tracer's diffs belong to this process's checks: none here.
                last = i == len(detailed) - 1
                census = "skip" if not last else (
                    "never" if self.config.census == "never" else "always")
                ctx = CheckContext(origin=Origin(epoch=e.epoch, step=e.end_step,
                                                 stage=self.config.stage),
                                   limits=self.limits(), total_steps=self.total_steps,
                                   steps_done=e.end_step,
                                   device_kind=getattr(self.device, "kind", "cuda") or "cuda",
                                   census=census)
                analyzer.check(e, ctx)
        except Exception as exc:  # noqa: BLE001
            log.warning("memwatch: the analyzer could not replay the restored epochs (%s: %s); "
                        "verdicts start fresh", type(exc).__name__, exc)
            self.analyzer = None
            self._start_analyzer()

