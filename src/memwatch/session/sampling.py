"""Where a session's samples come from and where they go: the probes it opened, the background
reader of slow values, and the timeline every sample is appended to.

:meth:`Sampling.record` is the hot path's one call: read the fast probes (counters that never
synchronise a device), append them with the background reader's last slow values, count the
step. Everything else here runs at start, at checks or when something fails.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from memwatch.core.costs import Costs
from memwatch.probes import procfs
from memwatch.probes.base import DeviceProbe, Probe
from memwatch.session.config import WatchConfig
from memwatch.session.faults import Faults
from memwatch.session.probes import NanProbe, open_probes, resolve_device
from memwatch.timeline import EpochSummary, Timeline
from memwatch.timeline.sampler import PACED_SHARE, BackgroundSampler, SlowReader

log = logging.getLogger("memwatch")

__all__ = ["Sampling"]

#: Metrics whose limit, inside a memory cgroup, is what the rest of the job leaves them.
_JOB_SHARED = ("host.rss", "host.uss", "host.pss", "host.rss_anon", "host.rss_shmem",
               "workers.uss", "workers.pss", "workers.rss")
#: This process's own memory: what its address-space and data-segment limits bound.
_OWN = ("host.rss", "host.uss", "host.pss", "host.rss_anon", "host.malloc_in_use")
#: The background reader's metrics read again at a step's sample (see Sampling._at_step).
_AT_STEP = ("host.malloc_in_use", "host.malloc_free")


def _gated(probe: Probe) -> Callable[[], Sequence[float]]:
    """``probe.read_fast``, or, for a probe whose read is dear (``fast_min_interval_s`` > 0: the
    CUDA probe), a read that calls it at most that often and repeats its last values between:
    the cost is bounded as a share of wall time however short the steps are."""
    read = probe.read_fast
    every = float(getattr(probe, "fast_min_interval_s", 0.0) or 0.0)
    if every <= 0:
        return read
    clock = time.perf_counter
    last: list[Any] = [-math.inf, ()]

    def gated() -> Sequence[float]:
        now = clock()
        if now - last[0] < every:
            return last[1]  # type: ignore[no-any-return]
        vals = read()
        last[0], last[1] = now, vals
        return vals

    return gated


class Sampling:
    """The probes, the slow reader, the background sampler and the timeline of one session.

    Attributes:
        device: the device probe (None: host and workers only).
        probes: every probe opened.
        timeline: the fixed-memory store of samples (None before ``open()``).
        step_count: samples recorded (optimizer steps), counting on across a resume.
        clock: the monotonic clock of the rows' times, and of the checks by time
            (``check_every_s``) the session schedules from them (tests replace it).
    """

    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, config: WatchConfig, faults: Faults,
                 costs: Costs) -> None:
        self._config = config
        self._faults = faults
        self._costs = costs
        self.device: DeviceProbe | None = None
        self.probes: list[Probe] = []
        self.timeline: Timeline | None = None
        self.step_count = 0
        self.slow: SlowReader | None = None
        self.sampler: BackgroundSampler | None = None
        self._fast: list[Probe] = []
        self._read: Callable[[], Sequence[float]] = tuple
        self._oom_kills_at_start: int | None = None
        #: A slow pass is owed at the next step (a unit started): see refresh_slow().
        self._refresh_due = False
        #: The slow reader's columns read again at a step (_at_step), with their keys, and
        #: whether the values about to reach the timeline were read at a step already (the
        #: refresh's).
        self._malloc_cols: tuple[tuple[int, str], ...] = ()
        self._read_at_step = False

    def open(self) -> None:
        """Open the probes, make the timeline and start the background sampler."""
        cfg = self._config
        self.device = resolve_device(cfg.device_spec)
        self.probes = open_probes(self.device, cfg.host, cfg.workers)
        self._fast = [p for p in self.probes if p.fast_keys]
        self._bind()
        self.slow = SlowReader([p for p in self.probes if p.slow_keys], self._probe_failed)
        self._malloc_cols = tuple((i, k) for i, k in enumerate(self.slow.keys)
                                  if k in _AT_STEP)
        fast_keys = [k for p in self._fast for k in p.fast_keys]
        self.timeline = Timeline(fast_keys + list(self.slow.keys), capacity=cfg.capacity,
                                 buckets_per_epoch=cfg.buckets_per_epoch,
                                 n_fast=len(fast_keys))
        if self._malloc_cols:
            self.timeline.restate = self._at_step
        # The first slow values are read after the first step (the refresh a unit owes) and
        # recorded with it: a pass here as well read the same memory a few ms apart.
        self._refresh_due = True
        cg = self.probe("cgroup")  # the baseline every later OOM-kill count is compared with
        self._oom_kills_at_start = cg.oom_kills() if cg is not None else None
        self.sampler = BackgroundSampler(self.slow, cfg.sample_every_s, costs=self._costs,
                                         share=PACED_SHARE if cfg.interval_s is None else None)
        self.sampler.start()

    def _bind(self) -> None:
        # The hot path calls one bound method it looked up once: the only fast probe's own
        # read_fast (the usual case: the host, or the device), or one that joins several.
        reads = tuple(_gated(p) for p in self._fast)
        if len(reads) == 1:
            self._read = reads[0]
        elif len(reads) == 2:  # a device and the host: their tuples, joined
            first, second = reads

            def read_two() -> Sequence[float]:
                return tuple(first()) + tuple(second())

            self._read = read_two
        else:
            def read_all() -> list[float]:
                vals: list[float] = []
                for read in reads:
                    vals.extend(read())
                return vals

            self._read = read_all

    # ------------------------------------------------------------------ hot path
    def record(self) -> float:
        """Sample every fast probe, store the sample, count the step; returns its time."""
        fast = self._read()
        if self._refresh_due:
            self._refresh()
        t = self.clock()
        n = self.step_count + 1
        # Count the step only once it is stored: a failed record retries in recover().
        self.timeline.record(n, t, fast, self.slow.values)  # type: ignore[union-attr]
        self.step_count = n
        return t

    def recover(self) -> float:
        """Slow path after a failed :meth:`record`: find the failing probe, replace it with NaN
        columns, record the step. Raises when the step still cannot be recorded."""
        for i, p in enumerate(list(self._fast)):
            try:
                got = p.read_fast()
                if len(got) != len(p.fast_keys):
                    raise RuntimeError(
                        f"read_fast returned {len(got)} values for {len(p.fast_keys)} keys")
            except Exception as e:  # noqa: BLE001
                self._probe_failed(p, e)
                self._fast[i] = NanProbe(p)
        self._bind()
        return self.record()

    def read_now(self) -> dict[str, float]:
        """The fast metrics now, and the C allocator's in-use and free bytes, not recorded: a
        check's closing reading (what the unit's last step and whatever ran after it left: an
        evaluation, epoch-end hooks). Empty when the probes cannot be read."""
        if self.timeline is None:
            return {}
        try:
            vals = self._read()
        except Exception:  # noqa: BLE001 - evidence only; the next step finds the failing probe
            return {}
        keys = [k for p in self._fast for k in p.fast_keys]
        out = {k: float(v) for k, v in zip(keys, vals, strict=False)}
        # The C allocator's in-use bytes: a stair shows there at once.
        out.update(self._heap_now() or {})
        return out

    def rss_now(self) -> float | None:
        """This process's RSS now (one read of the host probe), or None without it."""
        host = self.probe("host")
        if host is None:
            return None
        try:
            return float(host.read_fast()[0])
        except Exception:  # noqa: BLE001 - evidence only
            return None

    def footprint(self) -> tuple[float | None, float | None, float | None]:
        """This process's RSS and the C allocator's free and in-use bytes now (None where
        unknown): what a check is measured by (memwatch's own growth is RSS it adds less what
        it frees back to the allocator, which the run's next allocations reuse; its in-use
        bytes are what it left handed out)."""
        heap = self._heap_now()
        if heap is None:
            return self.rss_now(), None, None
        return self.rss_now(), heap["host.malloc_free"], heap["host.malloc_in_use"]

    def resume_at(self, step_count: int) -> None:
        """Continue the step numbering of a restored run (never backwards)."""
        self.step_count = max(self.step_count, int(step_count))

    # ------------------------------------------------------------------ checks and reads
    def refresh_slow(self) -> None:
        """Fresh slow readings (USS/PSS, RSS by kind, workers, the C allocator) for the rows of
        the next unit, taken at its first step, after a check.

        The closed unit's rows are already summarised, so a read before the check reaches no
        verdict. Read right after it, the next unit would start from a reading taken *before*
        its first step: state allocated lazily there (an optimizer's state at its first step,
        gradients at the first backward, workers started by a new epoch's iterator) would be
        missing from the unit's floor until the background's next pass, which a short unit may
        never see, and would then show as growth one unit late, added to that unit's own.
        Read at the first step, the unit starts from what the check left and what its first
        step made, as the per-step RSS sample does."""
        self._refresh_due = True

    def _at_step(self, slow: Sequence[float]) -> Sequence[float]:
        """``slow``, a background pass's values, with the C allocator's in-use and free bytes
        read again now, at a step's sample (the timeline's ``restate``: called when a pass's
        values first reach a sample, once per pass; the hot path pays nothing more).

        A pass runs at any moment of a step, when in-use bytes also hold the step's
        temporaries (activations, a batch being collated): its reading lies anywhere between
        what the loop keeps and that plus the temporaries, and a unit's floor or a stair read
        from it moves by megabytes with the moment (beside a busy machine, a pass inside the
        last step of an epoch read 2 MiB above what the epoch kept, and the 3.73 MiB stair a
        validation kept read as 1.74). Read where every per-step sample is taken, the loop's
        temporaries freed, in-use bytes are what the loop keeps, as the refresh at a unit's
        first step and a check's closing reading are: every reading of theirs is then
        comparable. ``mallinfo2`` once a pass (0.1 ms on a small heap, a few ms on a
        fragmented one) on the training thread stays within the passes' share."""
        if self._read_at_step:
            self._read_at_step = False
            return slow
        with self._costs.timed("in-use at a step"):
            now = self._heap_now()
        if not now:  # the pass's own reading stays
            return slow
        out = list(slow)
        for i, key in self._malloc_cols:
            v = now.get(key)
            if v is not None and out[i] == out[i]:  # not the NaN of a failed probe
                out[i] = float(v)
        return out

    def _heap_now(self) -> dict[str, float] | None:
        """The C allocator's in-use and free bytes now (the host probe's ``malloc_now``);
        None without the host probe or ``mallinfo2``, or when the read fails (evidence only)."""
        host = self.probe("host")
        if host is None:
            return None
        try:
            return host.malloc_now()  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - evidence only
            return None

    def _refresh(self) -> None:
        self._refresh_due = False
        if self.slow is None:
            return
        try:
            c0 = time.thread_time()
            with self._costs.timed("slow refresh"):
                self.slow.poll()
            # Read on this thread at a step's sample: in-use bytes already where a step
            # leaves them (see _at_step).
            self._read_at_step = True
            if self.sampler is not None:
                self.sampler.passed(time.thread_time() - c0)
        except Exception as e:  # noqa: BLE001 - each probe guards itself; this is the backstop
            self._faults.disable("slow reader", e)

    def latest(self) -> dict[str, float]:
        """The last sample as a flat dict of metric -> value (bytes, counts)."""
        return self.timeline.latest() if self.timeline is not None else {}

    def limits(self) -> dict[str, float]:
        """Known byte limits per metric, the one that binds first (see :meth:`binding`): device
        total, cgroup or physical memory; inside a memory cgroup a host or worker metric's limit
        is its own value plus the room the cgroup has left."""
        return {m: b for m, (b, _) in self.binding().items()}

    def binding(self) -> dict[str, tuple[float, str]]:
        """Per metric, the limit that will end the run first, in that metric's bytes, and its
        name: the device's memory; for host and worker metrics the tightest of physical memory,
        the memory cgroup and this process's address-space / data-segment limits.

        Inside a memory cgroup the kernel kills when the whole job (this process, its workers,
        everything else in the cgroup) fills the limit, so a host or worker metric's limit is
        its own value plus the room the cgroup has left: ``value + limit - working_set``. An
        address-space limit (``ulimit -v``) leaves room the same way: ``value + RLIMIT_AS -
        VmSize`` for this process's own memory.
        """
        out: dict[str, tuple[float, str]] = {}
        for p in self.probes:
            try:
                got = p.limits()
            except Exception:  # noqa: BLE001
                continue
            name = "the device's memory" if p is self.device else \
                "the memory cgroup" if p.name == "cgroup" else "physical memory"
            out.update({m: (b, name) for m, b in got.items()})
        latest = self.latest()

        def bind(metrics: tuple[str, ...], room: float, name: str) -> None:
            for m in metrics:
                v = latest.get(m)
                if v is not None and math.isfinite(v) and v + room < out.get(m, (math.inf,))[0]:
                    out[m] = (v + room, name)

        if "host.rss" in out:  # workers are processes of their own: the machine's limit
            for m in ("workers.uss", "workers.pss", "workers.rss"):
                out.setdefault(m, out["host.rss"])
        limit, used = latest.get("cgroup.limit"), latest.get("cgroup.working_set")
        if limit and used is not None and math.isfinite(limit) and math.isfinite(used):
            bind(_JOB_SHARED, max(0.0, limit - used), "the memory cgroup")
        if self._config.host and sys.platform.startswith("linux"):
            try:
                own = procfs.rlimit_room()
            except Exception:  # noqa: BLE001 - a limit is evidence, never a failure
                own = None
            if own is not None:
                bind(_OWN, *own)
        return out

    def probe(self, name: str) -> Any:
        """The open probe called ``name`` (``"host"``, ``"workers"``, ``"cgroup"``...), or
        None."""
        return next((p for p in self.probes if p.name == name), None)

    @property
    def epochs(self) -> list[EpochSummary]:
        """The epoch summaries kept (none before ``start()``)."""
        return self.timeline.epochs if self.timeline is not None else []

    def worker_details(self) -> list[dict[str, float]]:
        """The last reading of each live DataLoader worker."""
        p = self.probe("workers")
        return p.per_worker() if p is not None else []

    def worker_reading(self, pid: int) -> dict[str, float] | None:
        """The last reading of DataLoader worker ``pid``, also after it died."""
        p = self.probe("workers")
        return p.last_reading(pid) if p is not None else None

    def cgroup_info(self) -> dict[str, Any] | None:
        """Which memory cgroup is watched, its version and limit, and its OOM-kill counter at
        start and now (one read); None without a cgroup probe."""
        p = self.probe("cgroup")
        if p is None:
            return None
        return {**p.describe(), "oom_kills_at_start": self._oom_kills_at_start,
                "oom_kills": p.oom_kills()}

    def after_each_poll(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` on the background thread after each of its polls (the black box)."""
        if self.sampler is not None:
            self.sampler.after_poll = fn

    # ------------------------------------------------------------------ end
    def after_fork_in_child(self) -> None:
        if self.sampler is not None:
            self.sampler.forget_after_fork()

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        for p in self.probes:
            try:
                p.close()
            except Exception:  # noqa: BLE001
                log.debug("memwatch: probe %s failed to close", p.name, exc_info=True)

    def _probe_failed(self, probe: Probe, exc: BaseException) -> None:
        self._faults.disable(f"probe {probe.name}", exc)
