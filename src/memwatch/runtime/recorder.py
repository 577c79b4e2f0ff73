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
import dataclasses
import datetime as _dt
import logging
import mmap
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from memwatch.bundle import BundleWriter, clean_stale, enforce_retention, host_name
from memwatch.core.errors import ConfigError
from memwatch.runtime.capture import (
    Capture,
    address_space,
    capture,
    environment,
    environment_static,
    exception_doc,
    qualname,
    ranks_doc,
    rss_now,
    segments_summary,
    timeline_records,
)
from memwatch.core.oom import KINDS, OOM_KINDS, Classification, classify
from memwatch.core.redact import redact_obj, redact_text

if TYPE_CHECKING:
    from memwatch.session import MemWatch

__all__ = ["FlightRecorder", "RecorderConfig", "parse_bundle_on", "segments_summary"]

log = logging.getLogger("memwatch")

MIB = 1 << 20
_RESERVE_BYTES = 8 * MIB
_PENDING_MAX_AGE_S = 600.0
REPORT_MODES: tuple[str, ...] = ("auto", "full", "tables", "none")
def parse_bundle_on(value: Any) -> frozenset[str]:
    """``"oom"`` (default: every OOM class), ``"all"``, ``"none"``, or a collection of
    ``"oom"``, ``"cuda_oom"``, ``"host_oom"``, ``"mps_oom"``, ``"other"``."""
    names = {"oom": OOM_KINDS, "all": KINDS, "none": (), **{k: (k,) for k in KINDS}}
    items = [value] if isinstance(value, str) else value
    try:
        items = list(items) if items is not None else []
    except TypeError:
        items = [value]
    out: set[str] = set()
    for it in items:
        if not isinstance(it, str) or it not in names:
            raise ConfigError(
                f"bundle_on={value!r}: {it!r} is not a trigger; use 'oom' (default), 'all', "
                f"'none' or a tuple of {sorted(names)}."
            )
        out.update(names[it])
    return frozenset(out)


@dataclasses.dataclass(frozen=True)
class RecorderConfig:
    """Flight-recorder options (``MemWatch(recorder=..., bundle_on=..., ...)``).

    Defaults: bundles on every OOM class; at most 20 bundles and 1 GiB in ``<out_dir>/oom``; one
    bundle trimmed to 256 MiB (largest optional files first); 2000 timeline rows; census top 20.

    Example::

        >>> from memwatch.runtime.recorder import RecorderConfig, parse_bundle_on
        >>> cfg = RecorderConfig(bundle_on=parse_bundle_on(("host_oom", "other")), max_bundles=5)
        >>> sorted(cfg.bundle_on), cfg.max_total_bytes // 2**30
        (['host_oom', 'other'], 1)
    """

    enabled: bool = True
    bundle_on: frozenset[str] = frozenset(OOM_KINDS)
    max_bundles: int = 20
    max_bundle_bytes: int = 256 * MIB
    max_total_bytes: int = 1024 * MIB
    record_history: bool = False
    signals: bool = True
    timeline_rows: int = 2000
    census_top_n: int = 20
    #: report.html in each bundle: "full" (charts, plotly.js inlined: about 5 MB), "tables" (a few
    #: KiB; ``memwatch report BUNDLE`` draws the charts later), "none", or "auto": full, except
    #: tables for the bundles a distributed job's survivors write when the launcher stops them
    #: (signal bundles of a rank in a world of more than one: 1,024 of them would be 5 GB).
    report: str = "auto"

    def __post_init__(self) -> None:
        if self.report not in REPORT_MODES:
            raise ConfigError(f"bundle_report={self.report!r}: use one of "
                              f"{', '.join(map(repr, REPORT_MODES))}.")
        for name, lo in (("max_bundles", 1), ("max_bundle_bytes", 4096),
                         ("max_total_bytes", 4096), ("timeline_rows", 0),
                         ("census_top_n", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"{name}={v!r} must be an int >= {lo}.")
        if self.max_total_bytes < self.max_bundle_bytes:
            raise ConfigError(
                f"max_total_bytes={self.max_total_bytes} is below max_bundle_bytes="
                f"{self.max_bundle_bytes}; raise max_total_bytes or lower max_bundle_bytes."
            )


def _utc_stamp(t: float) -> str:
    # Milliseconds keep names unique and in time order when several bundles land in one second.
    d = _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    return d.strftime("%Y%m%dT%H%M%S") + f".{d.microsecond // 1000:03d}Z"


class FlightRecorder:
    """Writes OOM bundles for one :class:`memwatch.MemWatch` (created by its ``start()``)."""

    def __init__(self, session: MemWatch, config: RecorderConfig) -> None:
        self.session = session
        self.config = config
        self.oom_root = Path(session.out_dir).absolute() / "oom"  # immune to a later chdir
        self.bundles: list[Path] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pending: Capture | None = None
        self._reserve: mmap.mmap | None = None
        self._static_env: dict[str, Any] = {}
        self._seen_ids: collections.deque[int] = collections.deque(maxlen=64)
        self._prev_excepthook: Any = None
        self._prev_thread_hook: Any = None
        self._prev_signals: dict[int, Any] = {}
        self._observer_attached = False
        self._history_on = False
        #: >0 inside ``MemWatch.capture_oom()``: OOMs get a bundle whatever ``bundle_on`` says.
        self.forced = 0
        self._active = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        cfg = self.config
        try:
            removed = clean_stale(self.oom_root)
            if removed:
                log.info("memwatch: removed %d unfinished bundle(s) left by a crash", len(removed))
        except OSError as e:
            log.warning("memwatch: could not clean %s (%s)", self.oom_root, e)
        self._warm_imports()
        self._static_env = environment_static(self.session)
        self._arm_reserve()
        dev = self.session.device
        if dev is not None:
            try:
                self._observer_attached = bool(dev.attach_oom_observer(self._on_oom))
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: OOM observer not attached (%s); bundles are captured "
                            "when the exception arrives instead", e)
        if dev is not None and cfg.record_history:
            rec = getattr(dev, "record_history", None)
            if rec is not None:
                try:
                    self._history_on = bool(rec(True))
                except Exception as e:  # noqa: BLE001
                    log.warning("memwatch: allocation history not recorded (%s)", e)
        self._install_hooks()
        atexit.register(self._atexit)
        self._active = True

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
        self._uninstall_hooks()
        dev = self.session.device
        if dev is not None and self._observer_attached:
            try:
                dev.detach_oom_observer()
            except Exception:  # noqa: BLE001
                pass
            self._observer_attached = False
        if dev is not None and self._history_on:
            try:
                dev.record_history(False)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                pass
        self._release_reserve()

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

        import memwatch.report.html  # noqa: F401
        import memwatch.core.safepickle  # noqa: F401

        try:
            import memwatch.analysis.census  # noqa: F401
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

    # ------------------------------------------------------------------ hooks
    def _install_hooks(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        if not self.config.signals or threading.current_thread() is not threading.main_thread():
            return
        for name in ("SIGTERM", "SIGUSR1"):
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                self._prev_signals[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)
            except (ValueError, OSError) as e:
                self._prev_signals.pop(signum, None)
                log.warning("memwatch: %s handler not installed (%s)", name, e)

    def _uninstall_hooks(self) -> None:
        # Restore only what is still ours: if something chained on top of us, leave it (our hook
        # then just forwards, because the recorder is no longer active).
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._prev_thread_hook
        if threading.current_thread() is threading.main_thread():
            for signum, prev in list(self._prev_signals.items()):
                try:
                    if signal.getsignal(signum) == self._on_signal:
                        signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
                        del self._prev_signals[signum]
                except (ValueError, OSError):
                    pass

    def _excepthook(self, tp: type[BaseException], value: BaseException, tb: Any) -> None:
        if self._active and value is not None:
            self.handle_exception(value)
        prev = self._prev_excepthook or sys.__excepthook__
        prev(tp, value, tb)

    def _thread_excepthook(self, args: Any) -> None:
        if self._active and args.exc_value is not None:
            self.handle_exception(args.exc_value)
        prev = self._prev_thread_hook or threading.__excepthook__
        prev(args)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_signals.get(signum)
        if self._active and os.getpid() == self._pid:
            name = signal.Signals(signum).name
            self._dump(f"received {name}", None, trigger="signal")
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGTERM and prev in (signal.SIG_DFL, None):
            # The default action of SIGTERM is to terminate: do exactly that, after the bundle.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # SIGUSR1's default action would terminate the process; memwatch gives it the meaning
        # "write a bundle and go on", so a default USR1 handler is not re-raised.

    # ------------------------------------------------------------------ triggers
    def _on_oom(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """The allocator's OOM observer: runs inside the failing allocation, pre-unwind."""
        try:
            if not self._active or os.getpid() != self._pid:
                return
            if "cuda_oom" not in self.config.bundle_on and self.forced == 0:
                return  # no bundle would be written: skip the capture's cost
            obs = {"device": int(device), "tried_to_allocate": int(alloc),
                   "device_total": int(device_total), "device_free": int(device_free)}
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
        if path is not None and hasattr(exc, "add_note"):
            try:
                exc.add_note(f"memwatch: diagnostic bundle written to {path} "
                             f"(inspect it with: memwatch inspect {path})")
            except Exception:  # noqa: BLE001
                pass

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
            cls = classify(exc)
            wanted = cls.kind in self.config.bundle_on or (force_oom and cls.is_oom)
            cap: Capture | None = None
            pend = self._pending
            if (pend is not None and not pend.claimed and cls.kind == "cuda_oom"
                    and time.monotonic() - pend.mono < _PENDING_MAX_AGE_S):
                pend.claimed = True
                self._pending = None
                cap = pend
            if not wanted:
                self._mark(exc, None)
                return None
            if cap is None:
                self._release_reserve()  # room for the capture itself (census, copies)
                cap = self._capture(False, None)
            path = self._write("exception", None, exc, cls, cap)
            self._mark(exc, path)
            return path
        except Exception as e:  # noqa: BLE001 - the original exception must go on unchanged
            log.warning("memwatch: could not handle %s for a bundle (%s)", type(exc).__name__, e)
            return None

    def dump(self, reason: str, exc: BaseException | None = None) -> Path | None:
        """Write a bundle now (``trigger="manual"``); with ``exc``, include its exception.json."""
        return self._dump(reason, exc, trigger="manual")

    def _dump(self, reason: str, exc: BaseException | None, trigger: str) -> Path | None:
        try:
            if os.getpid() != self._pid:
                return None
            cls = classify(exc) if exc is not None else None
            self._release_reserve()
            path = self._write(trigger, reason, exc, cls, self._capture(False, None))
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
        """Called from the session every few steps: flush a capture nobody claimed."""
        pend = self._pending
        if pend is not None and not pend.claimed and time.monotonic() - pend.mono > 1.0:
            self._flush_pending()

    def _capture(self, pre_unwind: bool, observer: dict[str, int] | None) -> Capture:
        return capture(self.session, pre_unwind, observer, self.config.timeline_rows,
                       self.config.census_top_n)

    def _write(self, trigger: str, reason: str | None, exc: BaseException | None,
               cls: Classification | None, cap: Capture) -> Path | None:
        if not self._lock.acquire(blocking=False):
            log.warning("memwatch: a bundle is already being written; %s skipped", trigger)
            return None
        w: BundleWriter | None = None
        try:
            self._release_reserve()
            s = self.session
            rank = s.rank.get("rank", 0)
            name = f"{_utc_stamp(cap.wall)}-{host_name()}-rank{rank}-pid{os.getpid()}"
            w = BundleWriter(self.oom_root, name)
            if exc is not None:
                w.write_json("exception.json", exception_doc(exc, cls))
            elif cap.observer is not None:
                w.write_json("exception.json", {
                    "type": None, "message": None, "classification": "cuda_oom",
                    "numbers": {k: v for k, v in cap.observer.items() if k != "device"},
                    "traceback": None, "note": reason,
                })
            w.write_json("memory.json", {
                "latest": cap.latest, "limits": cap.limits, "observer": cap.observer,
                "host_rss_at_write": rss_now(), "address_space": address_space(),
                "captured_at_unix": cap.wall,
                "captured_on_thread": cap.thread, "capture_errors": cap.errors,
            })
            w.write_json("environment.json", environment(s, self._static_env, self._history_on))
            w.write_json("findings.json", redact_obj(cap.findings))
            w.write_jsonl("timeline.jsonl", timeline_records(cap))
            if cap.census is not None:
                w.write_json("census.json", redact_obj(cap.census))
            ranks = ranks_doc(s)
            if ranks is not None:
                w.write_json("ranks.json", redact_obj(ranks))
            if cap.memory_stats is not None or cap.snapshot is not None:
                w.write_json("allocator.json", {
                    "memory_stats": cap.memory_stats,
                    "segments_summary": segments_summary(cap.snapshot),
                })
            if cap.snapshot is not None:
                w.write_pickle("snapshot.pickle", redact_obj(cap.snapshot))
            manifest: dict[str, Any] = {
                "created_utc": _dt.datetime.fromtimestamp(cap.wall, _dt.timezone.utc)
                .isoformat(timespec="seconds"),
                "created_unix": cap.wall,
                "trigger": trigger,
                "reason": redact_text(reason) if reason else None,
                "classification": cls.kind if cls else ("cuda_oom" if cap.observer else None),
                "exception_type": qualname(type(exc)) if exc is not None else None,
                "pre_unwind": cap.pre_unwind,
                "host": host_name(),
                "pid": os.getpid(),
                "rank": rank,
                "local_rank": s.rank.get("local_rank", 0),
                "world_size": s.rank.get("world_size", 1),
                "job": dict(getattr(s, "job", None) or {}),
                "step": s.step_count,
                "epoch": s.epoch,
            }
            self._write_report(w, manifest)
            w.trim(self.config.max_bundle_bytes)
            path = w.commit(manifest)
            w = None
            self.bundles.append(path)
            try:
                enforce_retention(self.oom_root, self.config.max_bundles,
                                  self.config.max_total_bytes, keep=path)
            except OSError as e:
                log.warning("memwatch: bundle retention failed (%s)", e)
            log.warning("memwatch: %s bundle written to %s", trigger, path)
            hook = getattr(s, "_bundle_written", None)
            if hook is not None:  # the session's sinks (W&B artifact...); they never raise
                hook(path, manifest)
            return path
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: bundle not written (%s: %s)", type(e).__name__, e)
            return None
        finally:
            if w is not None:
                w.abort()
            self._lock.release()
            self._arm_reserve()

    def report_mode(self, trigger: str) -> str:
        """What report.html a bundle of ``trigger`` gets: "full", "tables" or "none"."""
        mode = self.config.report
        if mode != "auto":
            return mode
        world = self.session.rank.get("world_size", 1)
        return "tables" if trigger == "signal" and world > 1 else "full"

    def _write_report(self, w: BundleWriter, manifest: dict[str, Any]) -> None:
        from memwatch.bundle import SCHEMA_VERSION, Bundle
        from memwatch.report.html import render_bundle_html

        mode = self.report_mode(str(manifest.get("trigger")))
        if mode == "none":
            return
        files = w.sizes()
        preview = {"schema_version": SCHEMA_VERSION, "name": w.name, **manifest, "files": files,
                   "bytes": sum(files.values())}
        try:
            w.write_text("report.html", render_bundle_html(Bundle(w.tmp, preview),
                                                           str(w.root / w.name),
                                                           with_charts=mode == "full"))
        except Exception as e:  # noqa: BLE001
            w.errors["report.html"] = f"{type(e).__name__}: {e}"
