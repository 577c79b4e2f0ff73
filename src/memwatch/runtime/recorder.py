"""The flight recorder: a diagnostic bundle on disk whenever a run dies of memory.

Once a :class:`memwatch.MemWatch` is started, the recorder needs no setup:

* the device's out-of-memory observer (CUDA, :class:`memwatch.testing.FakeDevice`) runs *inside*
  the failing allocation, before the exception exists and before the stack unwinds; the recorder
  captures the allocator statistics, the snapshot, a census of live tensors and the recent
  timeline right then, and writes them with ``exception.json`` when the exception reaches
  :meth:`FlightRecorder.handle_exception` (from ``watch()``, an integration's ``on_exception``,
  ``sys.excepthook`` or ``threading.excepthook``);
* a host OOM (``MemoryError``, the CPU allocator's RuntimeError) or an MPS OOM is captured when
  the exception arrives;
* SIGTERM (preemption) and SIGUSR1 (a person asking) write a bundle, then hand the signal on.

The original exception is never replaced or swallowed: it gets a note (``exc.add_note``) and an
attribute ``memwatch_bundle`` naming the bundle, and one exception never produces two bundles.

Writing is frugal: a small address-space reserve is released just before writing (a run that hit
an address-space limit still has room to write), every file streams to disk, the number of
timeline rows and census entries is capped, and the modules it needs are imported at start.

Example::

    >>> import memwatch
    >>> from memwatch.testing import FakeDevice
    >>> dev = FakeDevice(total_bytes=64 * 2**20)
    >>> with memwatch.watch(device=dev, workers=False, out_dir=str(tmp)) as mw:
    ...     try:
    ...         with mw.capture_oom():
    ...             dev.malloc(128 * 2**20)
    ...     except Exception as e:
    ...         bundle = e.memwatch_bundle
    >>> (bundle / "manifest.json").exists()
    True
"""

from __future__ import annotations

import atexit
import collections
import logging
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memwatch.bundle.documents import Capture, environment_static
from memwatch.bundle.retention import clean_stale
from memwatch.core.oom import Classification, classify
from memwatch.core.protocols import SessionView
from memwatch.runtime.announce import announce_bundle
from memwatch.runtime.bundles import BundleMaker, ReportRenderer
from memwatch.runtime.capture import capture
from memwatch.runtime.elastic import write_error_file
from memwatch.runtime.hooks import FailureHooks
from memwatch.runtime.recorder_config import RecorderConfig, parse_bundle_on

__all__ = ["FlightRecorder", "RecorderConfig", "ReportRenderer", "parse_bundle_on"]

log = logging.getLogger("memwatch")

MIB = 1 << 20
_RESERVE_BYTES = 8 * MIB
_PENDING_MAX_AGE_S = 600.0
#: Steps recorded after an unclaimed pre-unwind capture before it is written on its own: the
#: step the OOM happened in (the program caught it and finished the step) and one more. Counted
#: in steps, not seconds: a loaded machine stretches a step past any wall-clock wait, and the
#: bundle then came before the program's own handling could claim it (a test failed so).
_PENDING_STEPS = 2


class FlightRecorder:
    """Writes OOM bundles for one session (created by ``MemWatch.start()``).

    Args:
        config: the recorder's options.
        view: the session's read-only view (what it captures: samples, limits, the device).
        on_bundle: called with ``(path, manifest)`` after every committed bundle (the session
            hands it to its sinks); must not raise.
        render_report: renders ``report.html`` (None: no report in bundles).
        ranks: returns ``ranks.json``'s content (rank 0 of a distributed run) or None.
        oom_dir: where bundles go (``<out_dir>/oom``, resolved once by the session:
            :class:`memwatch.bundle.paths.OutputPaths`); ``end_dir``: the end-of-run bundles a
            sink asks for at a clean close (not failures: ``<out_dir>/end_of_run``).
    """

    def __init__(self, config: RecorderConfig, view: SessionView, *, oom_dir: Path,
                 end_dir: Path | None = None,
                 on_bundle: Callable[[Path, dict[str, Any]], None] | None = None,
                 render_report: ReportRenderer | None = None,
                 ranks: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.config = config
        self.view = view
        self._on_bundle = on_bundle
        #: What a bundle holds, and where it goes.
        self.maker = BundleMaker(config, view, oom_dir, render_report=render_report,
                                 ranks=ranks, end_dir=end_dir)
        self.oom_root = oom_dir
        self.bundles: list[Path] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pending: Capture | None = None
        self._pending_step = 0  # the step count when the pending capture was taken
        self._reserve: mmap.mmap | None = None
        self._seen_ids: collections.deque[int] = collections.deque(maxlen=64)
        self.hooks = FailureHooks(self.handle_exception, self._on_signal, config.signals)
        self._observer_attached = False
        self._history_on = False
        #: >0 inside ``MemWatch.capture_oom()``: OOMs get a bundle whatever ``bundle_on`` says.
        self.forced = 0
        self._active = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        try:
            removed = clean_stale(self.oom_root)
            if removed:
                log.info("memwatch: removed %d unfinished bundle(s) left by a crash", len(removed))
        except OSError as e:
            log.warning("memwatch: could not clean %s (%s)", self.oom_root, e)
        self._warm_imports()
        dev = self.view.device
        self.maker.static_env = environment_static(dev)
        self._arm_reserve()
        if dev is not None:
            try:
                self._observer_attached = bool(dev.attach_oom_observer(self._on_oom))
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: OOM observer not attached (%s); bundles are captured "
                            "when the exception arrives instead", e)
        if dev is not None and self.config.record_history:
            rec = getattr(dev, "record_history", None)
            if rec is not None:
                try:
                    self._history_on = bool(rec(True))
                except Exception as e:  # noqa: BLE001
                    log.warning("memwatch: allocation history not recorded (%s)", e)
        self.hooks.install()
        atexit.register(self._atexit)
        self._active = True

    def kernel_oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this run's cgroup since it started."""
        info = self.maker.cgroup_info() or {}
        now, start = info.get("oom_kills"), info.get("oom_kills_at_start")
        return max(0, now - start) if now is not None and start is not None else 0

    def close(self) -> None:
        """Restore hooks and handlers, detach the observer; flush an unclaimed OOM capture."""
        if not self._active or os.getpid() != self._pid:
            return
        # close() from a `finally:` or `__exit__` while an exception propagates: that exception
        # would reach sys.excepthook only after our hook is gone, so handle it here.
        in_flight = sys.exc_info()[1]
        if in_flight is not None:
            self.handle_exception(in_flight)
        self._active = False
        try:
            atexit.unregister(self._atexit)
        except Exception:  # noqa: BLE001
            pass
        self._flush_pending()
        self.hooks.uninstall()
        dev = self.view.device
        if dev is not None and self._observer_attached:
            try:
                dev.detach_oom_observer()
            except Exception:  # noqa: BLE001
                pass
            self._observer_attached = False
        if dev is not None and self._history_on:
            try:
                dev.record_history(False)
            except Exception:  # noqa: BLE001
                pass
        self._release_reserve()

    @property
    def history_recording(self) -> bool:
        """The device's allocation history is being recorded (``record_history=True``)."""
        return self._history_on

    def _atexit(self) -> None:
        try:
            self._flush_pending()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def _warm_imports() -> None:
        # Imported now, not while memory is exhausted.
        import json  # noqa: F401
        import pickle  # noqa: F401

        import memwatch.core.safepickle  # noqa: F401

        try:
            import memwatch.analysis.culprits.census.census  # noqa: F401
        except Exception:  # noqa: BLE001 - the census is optional
            pass

    def _arm_reserve(self) -> None:
        # An untouched anonymous mapping costs address space, not resident memory: released
        # before a write, it gives a run that hit RLIMIT_AS (or a fragmented heap) room to write.
        if self._reserve is None:
            try:
                self._reserve = mmap.mmap(-1, _RESERVE_BYTES)
            except (OSError, ValueError):
                self._reserve = None

    def _release_reserve(self) -> None:
        r, self._reserve = self._reserve, None
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ triggers
    def _on_signal(self, name: str) -> bool:
        if self._lock.locked():  # a bundle is being written: the signal waits for it
            return False
        self._dump(f"received {name}", None, trigger="signal")
        return True

    def _on_oom(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """The allocator's OOM observer: runs inside the failing allocation, pre-unwind."""
        try:
            if not self._active or os.getpid() != self._pid:
                return
            if "cuda_oom" not in self.config.bundle_on and self.forced == 0:
                return  # no bundle would be written: skip the capture's cost
            obs = {"device": int(device), "tried_to_allocate": int(alloc),
                   "device_total": int(device_total), "device_free": int(device_free)}
            self._pending_step = self._steps()
            self._pending = self._capture(True, obs)
        except Exception as e:  # noqa: BLE001 - never turn an OOM into a different error
            log.warning("memwatch: pre-unwind OOM capture failed (%s)", e)

    def _seen(self, exc: BaseException) -> tuple[bool, Path | None]:
        cur: BaseException | None = exc
        for _ in range(8):
            if cur is None:
                break
            if "memwatch_bundle" in getattr(cur, "__dict__", {}):
                return True, cur.__dict__["memwatch_bundle"]
            if id(cur) in self._seen_ids:
                return True, None
            cur = cur.__cause__ or cur.__context__
        return False, None

    def _mark(self, exc: BaseException, path: Path | None) -> None:
        try:
            exc.memwatch_bundle = path  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - exceptions without a __dict__
            self._seen_ids.append(id(exc))

    def handle_exception(self, exc: BaseException, force_oom: bool = False) -> Path | None:
        """Classify ``exc`` and write a bundle if configured for its class (see the module doc)."""
        try:
            if os.getpid() != self._pid:
                return None
            seen, path = self._seen(exc)
            if seen:
                return path
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                self._mark(exc, None)
                return None
            cls = classify(exc, self.kernel_oom_kills())
            wanted = cls.kind in self.config.bundle_on or (force_oom and cls.is_oom)
            cap: Capture | None = None
            pend = self._pending
            if (pend is not None and not pend.claimed and cls.kind == "cuda_oom"
                    and time.monotonic() - max(pend.mono, pend.done) < _PENDING_MAX_AGE_S):
                pend.claimed = True
                self._pending = None
                cap = pend
            if not wanted:
                self._mark(exc, None)
                return None
            if cap is None:
                self._release_reserve()  # room for the capture itself (census, copies)
                cap = self._capture(False, None, killer=cls.is_oom)
            path = self._write("exception", None, exc, cls, cap)
            self._mark(exc, path)
            return path
        except Exception as e:  # noqa: BLE001 - the original exception must go on unchanged
            log.warning("memwatch: could not handle %s for a bundle (%s)", type(exc).__name__, e)
            return None

    def dump(self, reason: str, exc: BaseException | None = None,
             trigger: str = "manual") -> Path | None:
        """Write a bundle now (``trigger``: "manual", "watchdog" when the watchdog asks,
        "end_of_run" when a sink asks for one at a clean close); with ``exc``, its exception."""
        return self._dump(reason, exc, trigger=trigger)

    def _dump(self, reason: str, exc: BaseException | None, trigger: str) -> Path | None:
        try:
            if os.getpid() != self._pid:
                return None
            cls = classify(exc, self.kernel_oom_kills()) if exc is not None else None
            self._release_reserve()
            path = self._write(trigger, reason, exc, cls,
                               self._capture(False, None, killer=cls is not None and cls.is_oom))
            if exc is not None and path is not None:
                self._mark(exc, path)
            return path
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: bundle not written (%s)", e)
            return None

    def _flush_pending(self) -> None:
        """An OOM the observer saw but whose exception never reached memwatch (caught by the
        program, or the process is exiting): keep its evidence anyway."""
        pend = self._pending
        if pend is None or pend.claimed:
            return
        pend.claimed = True
        self._pending = None
        self._write("oom_observer", "the exception did not reach memwatch (caught by the "
                    "program, or the process exited first)", None, None, pend)

    def has_pending(self) -> bool:
        """An OOM was captured before the unwind and nobody claimed it yet."""
        pend = self._pending
        return pend is not None and not pend.claimed

    def take_pending(self) -> Capture | None:
        """Claim the unclaimed pre-unwind OOM capture, if any, so no bundle is written for it.

        For integrations that know the program recovered from that OOM (a batch-size finder
        caught it and retried): they decide whether it deserves a bundle (:meth:`write_recovered`)
        or only an event."""
        pend = self._pending
        if pend is None or pend.claimed:
            return None
        pend.claimed = True
        self._pending = None
        return pend

    def write_recovered(self, cap: Capture, reason: str) -> Path | None:
        """Write a claimed capture as an ``oom_observer`` bundle (``reason`` says it was
        recovered)."""
        return self._write("oom_observer", reason, None, None, cap)

    def on_step_boundary(self) -> None:
        """Called from the session every few steps: flush a capture nobody claimed once
        :data:`_PENDING_STEPS` steps were recorded after it (the program caught the OOM)."""
        pend = self._pending
        if pend is not None and not pend.claimed and \
                self._steps() - self._pending_step >= _PENDING_STEPS:
            self._flush_pending()

    def _steps(self) -> int:
        return int(self.view.step_count)

    def _capture(self, pre_unwind: bool, observer: dict[str, int] | None,
                 killer: bool = True) -> Capture:
        return capture(self.view, pre_unwind, observer, self.config.timeline_rows,
                       self.config.census_top_n, killer=killer)

    # ------------------------------------------------------------------ writing
    def _write(self, trigger: str, reason: str | None, exc: BaseException | None,
               cls: Classification | None, cap: Capture) -> Path | None:
        if not self._lock.acquire(blocking=False):
            log.warning("memwatch: a bundle is already being written; %s skipped", trigger)
            return None
        try:
            self._release_reserve()
            path, manifest = self.maker.write(trigger, reason, exc, cls, cap, self._history_on)
            self.bundles.append(path)
            announce_bundle(path, trigger, exc)  # one line: a note on exc, else the log
            write_error_file(path, trigger, exc, cls.kind if cls else None)  # for torchrun
            if self._on_bundle is not None:  # the session's sinks (W&B artifact...)
                self._on_bundle(path, manifest)
            return path
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: bundle not written (%s: %s)", type(e).__name__, e)
            return None
        finally:
            self._lock.release()
            self._arm_reserve()
            self.hooks.release_deferred()  # a SIGTERM that came while writing acts now

    def report_mode(self, trigger: str, kind: str | None = None) -> str:
        """What report.html a bundle of ``trigger`` (and classification ``kind``) gets: "full",
        "tables" or "none"."""
        return self.maker.report_mode(trigger, kind)
