"""What the analyzer is told: its tuning (:class:`AnalyzerConfig`) and, at every check, the
context a verdict needs besides the summaries (:class:`CheckContext`).

The analyzer never reads the session: the session builds a ``CheckContext`` at each check (known
limits, the run's planned length, where the finding is born, whether a census may run), so the
verdicts are functions of epoch summaries plus this value. What a verdict needs from the live
process comes through the port of :mod:`memwatch.analysis.evidence`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from memwatch.analysis.stats.forecast import remaining_steps
from memwatch.analysis.stats.held import held_stairs, verdict, worth_reporting
from memwatch.analysis.stats.shapes import EpochStats, ShapeConfig
from memwatch.core.findings import Origin
from memwatch.timeline import EpochSummary

__all__ = ["CENSUS_MODES", "AnalyzerConfig", "CheckContext"]

#: ``"auto"``: a census when growth is suspected or it is cheap; ``"always"``; ``"never"``;
#: ``"skip"``: not at this check (replaying a checkpoint's epochs).
CENSUS_MODES = ("auto", "always", "never", "skip")


@dataclasses.dataclass(frozen=True)
class AnalyzerConfig:
    """Tuning of the verdicts. The defaults are what the detection benchmark is scored with.

    Example::

        >>> from memwatch.analysis import AnalyzerConfig
        >>> AnalyzerConfig(near_oom_margin=0.05).near_oom_margin
        0.05
    """

    shape: ShapeConfig = ShapeConfig()
    carry_fraction: float = 0.5  # share of the previous epoch's rise that must still be held
    deceleration: float = 0.5  # slope (upper CI) under this share of the last epoch's: saturating
    near_oom_margin: float = 0.10  # near_oom when the epoch peak is within this share of the limit
    # Severity by consequence: growth that reaches its limit before the run ends (or within
    # MemWatch(horizon_s=...) when the run's length is unknown) is a warning; one that reaches
    # it within this many more checks (epochs, or stretches between checks) is critical: it
    # dies before memwatch speaks again. Slower growth is information.
    critical_checks: float = 2.0
    # census="auto" takes a census when the series gives a reason: a leak verdict to name
    # (always), steady growth (when the heap holds at most census_max_objects objects), a weaker
    # hint (also within the session's cost budget). census_when_suspected=False: verdicts only.
    census_max_objects: int = 1_000_000
    census_when_suspected: bool = True
    holder_budget_s: float = 5.0  # CPU seconds allowed to name holders at one check
    retention_explained: float = 0.2  # host growth explained by objects below this share
    # Host RSS growth of which file-backed pages are at least this share is judged in parts:
    # the file-backed pages (``mapped_file``, info: the kernel reclaims them) and the anonymous
    # and shared-memory parts, each by the usual rules. A majority: below it the anonymous part
    # is most of the growth and judging RSS as one says the same about it.
    mapped_file_share: float = 0.5
    info_min_rel: float = 0.01  # info findings (plateau, step) only above this share of level
    # Copy-on-write in DataLoader workers is reported once the pages it made private are this
    # share of the job's private memory (the main process's USS plus the workers'): a worker
    # always copies a few pages (reference counts of the modules it runs), and what users need
    # to hear about is copying that costs the job memory (pytorch#13246).
    cow_min_share: float = 0.02
    # ... and at least this much per worker: a worker's own start-up touches the interpreter's
    # and the parent's objects whatever the Dataset (about 2 MiB per worker measured with a
    # numpy Dataset, against 10-15 MiB per worker reading 30,000 Python strings).
    cow_min_per_worker: float = 4 * 2**20
    # A host leak verdict that no live object explains (native memory, the allocator keeping
    # freed memory, memory outside malloc) stands on the RSS floors alone, so it needs the floor
    # to stand more than this above the lowest floor of the units judged: where glibc places
    # each epoch's allocations moves a leak-free run's RSS floor by up to ~3 MiB between epochs,
    # either way (measured on the corpus controls ctrl_epoch_accumulation,
    # ctrl_late_optimizer_state and rep_sampler_index_list, several runs each), so it can rise
    # at two checks in a row without a leak. That drift is bounded and a leak is not: a slow
    # native leak is said once it has grown past it. A leak whose holder the census names needs
    # no such margin: the census is evidence of its own.
    unnamed_min_growth: float = 4 * 2**20

    def __post_init__(self) -> None:
        for name in ("carry_fraction", "near_oom_margin", "retention_explained",
                     "mapped_file_share", "cow_min_share"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"AnalyzerConfig.{name}={v!r} must be between 0 and 1")
        if not self.critical_checks > 0:
            raise ValueError("AnalyzerConfig.critical_checks must be positive")
        for name in ("cow_min_per_worker", "unnamed_min_growth"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"AnalyzerConfig.{name} must be >= 0 bytes")
        if self.census_max_objects < 0:
            raise ValueError("AnalyzerConfig.census_max_objects must be >= 0")

    def held(self, hist: list[EpochStats]) -> str:
        """The held-growth verdict on ``hist``'s latest unit with this tuning
        (:func:`memwatch.analysis.stats.held.verdict`)."""
        return verdict(hist, self.carry_fraction, self.deceleration, self.shape.noise_k)

    def stairs(self, hist: list[EpochStats]) -> float | None:
        """The height of two equal stairs held over ``hist``'s last two units, or None
        (:func:`memwatch.analysis.stats.held.held_stairs` with this tuning's ``noise_k``)."""
        return held_stairs(hist, self.shape.noise_k)

    def worth(self, cur: EpochStats, amount: float) -> bool:
        """An informational finding about ``amount`` bytes is worth saying (at least
        ``shape.min_growth_bytes`` and ``info_min_rel`` of the level)."""
        return worth_reporting(cur, amount, self.shape.min_growth_bytes, self.info_min_rel)


@dataclasses.dataclass(frozen=True)
class CheckContext:
    """Everything one check knows besides the epoch summaries.

    Attributes:
        origin: where the findings of this check are born (epoch, step, rank, stage, check).
        at: ``"epoch_end"`` (the summary is a closed epoch) or ``"interval"`` (a check inside the
            epoch: the summary is the segment since the previous check).
        partial: at an interval check once an epoch has ended: the epoch so far (judged
            against the closed epochs when the last of them grew inside, so that growth
            released at epoch ends stays accumulation).
        horizon_s: when ``total_steps`` is unknown, growth reaching a limit within this much
            wall time can kill the run (a warning); slower growth is information.
        defer_leaks: an interval check in the first epoch of a run planned to have more: leave
            leak and accumulation verdicts to the epoch end.
        limits: per metric, the byte limit that ends the run first (device total; for host
            metrics the tightest of physical memory, the memory cgroup, RLIMIT_AS/RLIMIT_DATA).
        limit_names: per metric, what that limit is, for messages ("physical memory", "the
            memory cgroup", "the address space (RLIMIT_AS, ulimit -v)").
        total_steps: the run's planned number of optimizer steps, when known.
        steps_done: optimizer steps so far.
        device_kind: "cuda", "rocm", "mps", "fake"...: which census device the device metrics
            are about.
        census: one of :data:`CENSUS_MODES`.
        trace: this check's allocation-site diff (``MemWatch(tracemalloc=...)``), or None.
        tracing: tracemalloc runs now (the census then counts no object types: the
            allocation sites replace them).
        mapped_files: where a ``mapped_file`` verdict reads which data files are mapped.
        collected: a ``gc.collect()`` ran a moment ago for this check (the census skips its
            own).
    """

    origin: Origin = Origin()
    at: str = "epoch_end"
    partial: EpochSummary | None = None
    limits: Mapping[str, float] = dataclasses.field(default_factory=dict)
    limit_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    total_steps: int | None = None
    steps_done: int = 0
    horizon_s: float = 3 * 86400.0
    defer_leaks: bool = False
    device_kind: str = "cuda"
    census: str = "auto"
    trace: Any = None
    tracing: bool = False
    collected: bool = False
    #: The data files mapped now, most resident first (path, bytes); None: ask the analyzer's
    #: evidence port when a mapped-file verdict needs them (tests script them here).
    mapped_files: Callable[[], list[tuple[str, float]]] | None = None
    #: The device allocator's snapshot, when its history is recorded (``record_history=True``):
    #: a device leak's tensors are joined to where they were allocated. None: not recorded.
    device_snapshot: Callable[[], Any] | None = None
    #: May optional work of this many seconds run now (the session's cost budget,
    #: :class:`memwatch.core.costs.Costs`)? None: always.
    budget: Callable[[float], bool] | None = None
    #: RSS memwatch's own work at earlier checks left behind (bytes): this process's host
    #: metrics are judged without it (a census that grows the heap is not the run's leak).
    own_growth: float = 0.0
    #: RSS memwatch's checks added while they ran, summed over earlier checks (bytes), before
    #: subtracting what they freed back to the C allocator. Whether the run reuses that freed
    #: memory is unknown: host growth no live object explains and no larger than this churn
    #: between two units is no evidence of the run's (see ``docs/findings.md``).
    own_churn: float = 0.0
    #: The C allocator's in-use bytes memwatch's own work at earlier checks left handed out
    #: (bytes; the same counters read around each check): ``host.malloc_in_use`` is judged
    #: without them.
    own_in_use: float = 0.0
    #: The fast metrics read at this check, before its own work: after the unit's last step
    #: and whatever ran after it (an evaluation, epoch-end hooks). Memory a boundary takes and
    #: keeps shows here first (:attr:`EpochStats.stair`).
    closing: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: What ran since the unit's last step ("val": an evaluation loop), when told.
    after: str | None = None
    #: An evaluation loop judged beside a training session of the same process: memory kept
    #: across its runs is the training session's to judge (it sees what each evaluation
    #: leaves, at the run's pace, and what training adds between two evaluations, which this
    #: session would count as its own); this one says what happens inside an evaluation.
    beside_training: bool = False
    #: The run's pace: wall seconds per optimizer step since the first check's unit began,
    #: evaluations and checks included (forecasts in wall time use it); None: the unit's own.
    seconds_per_step: float | None = None

    def __post_init__(self) -> None:
        if self.census not in CENSUS_MODES:
            raise ValueError(f"CheckContext.census={self.census!r}: use one of {CENSUS_MODES}")

    def remaining(self, cur: EpochStats) -> float:
        """Steps this run has left (:func:`memwatch.analysis.stats.forecast.remaining_steps`),
        at the pace of ``cur``."""
        return remaining_steps(cur, self.total_steps, self.steps_done, self.horizon_s)

    def limit(self, metric: str) -> float | None:
        """The byte limit ``metric`` runs into (workers share the host's), or None."""
        lim = self.limits.get(metric)
        if lim is None and metric.startswith("workers."):
            lim = self.limits.get("host.rss")
        return float(lim) if lim else None

    def limit_name(self, metric: str) -> str | None:
        """How messages name the limit of :meth:`limit` (None: say only its size)."""
        name = self.limit_names.get(metric)
        if name is None and metric.startswith("workers."):
            name = self.limit_names.get("host.rss")
        return name

    @property
    def device_prefix(self) -> str:
        """The census device prefix of the device metrics: ``"mps"`` or ``"cuda"``."""
        return "mps" if self.device_kind == "mps" else "cuda"
