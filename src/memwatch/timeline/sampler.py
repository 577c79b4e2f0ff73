"""The background sampler: slow reads (USS/PSS, workers, mem_get_info, NVML) off the hot path.

The thread publishes one list of values per pass by plain attribute assignment (atomic under the
GIL), so the training thread never takes a lock to read them: ``step()`` takes no lock at all.
The one lock, held across a pass's reads, keeps two passes from running at once (the background
thread's and the refresh a check owes the next unit's first step), because probes keep state
between passes. A DataLoader worker forked mid-pass may inherit it held, which is harmless: a
forked child's session is inert and never polls.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from memwatch.core.costs import Costs
from memwatch.probes.base import Probe

log = logging.getLogger("memwatch")


class SlowReader:
    """Reads every probe's slow metrics into one list ordered like ``keys``."""

    def __init__(self, probes: Sequence[Probe], on_failure: Callable[[Probe, BaseException], None]):
        self.probes = list(probes)
        self.keys: tuple[str, ...] = tuple(k for p in self.probes for k in p.slow_keys)
        self._index = {k: i for i, k in enumerate(self.keys)}
        self._on_failure = on_failure
        self.disabled: set[str] = set()
        self.values: list[float] = [math.nan] * len(self.keys)
        self.passes = 0
        self._lock = threading.Lock()

    def poll(self) -> list[float]:
        """One pass over every probe's slow reads; publishes and returns the new values."""
        with self._lock:
            return self._poll_locked()

    def _poll_locked(self) -> list[float]:
        new = list(self.values)
        for p in self.probes:
            if p.name in self.disabled:
                continue
            try:
                got = p.read_slow()
            except Exception as e:  # noqa: BLE001 - a failing probe disables itself, never raises
                self.disabled.add(p.name)
                for k in p.slow_keys:
                    new[self._index[k]] = math.nan
                self._on_failure(p, e)
                continue
            for k, v in got.items():
                i = self._index.get(k)
                if i is not None:
                    new[i] = float(v)
        self.values = new  # one atomic publish
        self.passes += 1
        return new


#: The share of one core the background passes may take when the period is memwatch's to pick.
PACED_SHARE = 0.005


class BackgroundSampler:
    """Runs :meth:`SlowReader.poll` every ``interval_s`` seconds on a daemon thread.

    ``share=None`` keeps ``interval_s`` whatever a pass costs (the user chose the period).
    A pass costs CPU in proportion to what it reads (``smaps_rollup`` walks the page tables of
    this process and of each worker: about 20 ms per GiB of RSS). The wait after a pass is
    stretched so that passes take at most ``share`` of one core: ``max(interval_s, cpu /
    share)``, from the pass's own CPU time (``time.thread_time``: not inflated by other
    processes, so a busy machine samples as often as a quiet one). ``costs`` records the
    passes' and the black box's CPU seconds.
    """

    def __init__(self, reader: SlowReader, interval_s: float, costs: Costs | None = None,
                 share: float | None = PACED_SHARE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self._clock = clock  # when passes are due (tests inject one)
        self.interval_s = interval_s
        self.share = share
        self.costs = costs
        #: The wait after the latest pass (``interval_s``, or longer for a costly pass).
        self.wait_s = interval_s
        self._next_at = self._clock() + interval_s
        #: Called on this thread after each pass (the black box's rewrite); must not raise.
        self.after_poll: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memwatch-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._next_at = self._clock() + self.wait_s
        while not self._stop.wait(max(self._next_at - self._clock(), 0.0)):
            if not self.due():
                continue  # a pass ran on another thread meanwhile (see passed())
            try:
                c0 = time.thread_time()
                self.reader.poll()
                c1 = time.thread_time()
                if self.after_poll is not None:
                    self.after_poll()
                c2 = time.thread_time()
                if self.costs is not None:
                    self.costs.add("background reads", c1 - c0)
                    self.costs.add("black box", c2 - c1)
                self._paced(c2 - c0)
            except Exception:  # noqa: BLE001 - the thread must survive anything
                log.warning("memwatch: background sampler pass failed", exc_info=True)
                self._next_at = self._clock() + self.wait_s

    def _paced(self, cpu_s: float) -> None:
        if self.share is not None:
            self.wait_s = max(self.interval_s, min(cpu_s / self.share, 60.0))
        self._next_at = self._clock() + self.wait_s

    def due(self) -> bool:
        """The next pass is due: the wait after the latest pass, here or on another thread
        (:meth:`passed`), is over."""
        return self._clock() >= self._next_at

    def passed(self, cpu_s: float) -> None:
        """A pass of ``cpu_s`` CPU seconds ran on another thread (the refresh a unit's first
        step owes): the next pass here waits as if it had been this thread's own, so that the
        passes of both threads together keep to ``share`` (at 4-s epochs a refresh every unit
        and paced background passes on top took 1.2% of a fit, not 0.5%). The refresh is what
        a unit's floors start from; the background's passes fill in between."""
        self._paced(cpu_s)

    def stop(self, timeout: float = 5.0) -> None:
        t, self._thread = self._thread, None
        if t is None:
            return
        self._stop.set()
        t.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def forget_after_fork(self) -> None:
        """In a forked child the thread does not exist: drop it without joining."""
        self._thread = None
        self._stop = threading.Event()
