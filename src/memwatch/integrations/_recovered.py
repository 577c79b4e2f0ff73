"""OOMs a program caught and retried (a batch-size finder: Accelerate's
``find_executable_batch_size``, the HF ``Trainer``'s ``auto_find_batch_size``): one event each,
in one schema for every adapter, and no bundle unless asked (:class:`RecoveredOOMs`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.session import MemWatch

__all__ = ["RecoveredOOMs"]

log = logging.getLogger("memwatch")

_MAX_RECOVERED = 100


def device_ooms(mw: MemWatch | None) -> float | None:
    """The device's out-of-memory counter now (None without a device that counts them)."""
    dev = mw.device if mw is not None else None
    if dev is None or "device.ooms" not in dev.fast_keys:
        return None
    return float(dev.read_fast()[list(dev.fast_keys).index("device.ooms")])


class RecoveredOOMs:
    """The recovered OOMs of one adapter.

    Args:
        mode: ``"event"`` (an entry in :attr:`events`, a log line, no bundle) or ``"bundle"``
            (also one small bundle, without the allocator snapshot, for the first of them).

    Attributes:
        events: one dict per recovery (``attempt``, ``step``, ``ooms``, ``batch_size``,
            ``failed_batch_size``, ``new_batch_size``, ``tried_to_allocate``, ``bundle``), the
            latest 100.
    """

    def __init__(self, mode: str) -> None:
        if mode not in ("event", "bundle"):
            raise ConfigError(
                f"recovered_oom={mode!r}: use 'event' (no bundle) or 'bundle' (one bundle for "
                "the first OOM a batch-size finder recovered from).")
        self.mode = mode
        self.events: list[dict[str, Any]] = []
        self._seen: float | None = None

    @property
    def count(self) -> int:
        """The OOMs of every event."""
        return sum(int(e["ooms"]) for e in self.events)

    def baseline(self, mw: MemWatch | None) -> None:
        """A session starts: the device's OOM counter from here on counts."""
        self._seen = device_ooms(mw)

    def record(self, mw: MemWatch | None, *, ooms: int | None, failed_batch_size: int | None,
               new_batch_size: int | None) -> dict[str, Any]:
        """One recovery (see :meth:`memwatch.integrations._driver.Driver.recovered_oom`)."""
        if ooms is None:
            now = device_ooms(mw)
            before, self._seen = self._seen, now
            ooms = int(now - before) if now is not None and before is not None \
                and now - before >= 1 else 1
        size = failed_batch_size if failed_batch_size is not None else new_batch_size
        event: dict[str, Any] = {
            "attempt": len(self.events) + 1, "step": mw.step_count if mw else None,
            "ooms": int(ooms), "batch_size": size, "failed_batch_size": failed_batch_size,
            "new_batch_size": new_batch_size, "tried_to_allocate": None, "bundle": None}
        try:
            rec = mw.recorder if mw is not None else None
            cap = rec.take_pending() if rec is not None else None
            if cap is not None and cap.observer:
                event["tried_to_allocate"] = cap.observer.get("tried_to_allocate")
            if rec is not None and cap is not None and self.mode == "bundle" \
                    and not any(e["bundle"] for e in self.events):
                path = rec.write_recovered(dataclasses.replace(cap, snapshot=None), (
                    f"out of memory at batch size {size}; recovered by the batch-size finder, "
                    "which retried with a smaller batch"))
                event["bundle"] = None if path is None else str(path)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not record the recovered OOM (%s: %s)",
                        type(e).__name__, e)
        self.events.append(event)
        del self.events[:-_MAX_RECOVERED]
        log.info("memwatch: %d out-of-memory error(s) at batch size %s recovered by a "
                 "batch-size finder (no bundle written)", ooms, size)
        return event
