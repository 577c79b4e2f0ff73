"""Metric names and units as memwatch writes them to experiment loggers.

Every framework integration (Lightning, transformers, Accelerate, the W&B sink) logs memwatch
series under the same keys, so a dashboard built for one works for the others.

Naming rules
------------
* One prefix, ``memwatch``, followed by ``/``: W&B (and TensorBoard) group panels by the segment
  before the first ``/``, so every memwatch chart lands in one section.
* Training series carry no stage segment (they are what people look at first):
  ``memwatch/host.rss_gib``. Evaluation series are kept apart with a stage segment:
  ``memwatch/val/host.rss_gib``, ``memwatch/test/host.rss_gib``.
* Units are part of the name, converted from the bytes memwatch stores:

  ========================  ==========  =============================================
  suffix                    unit        used for
  ========================  ==========  =============================================
  ``_gib``                  GiB         memory levels; GiB = 2**30 bytes (binary)
  ``_mib_per_step``         MiB/step    growth rates of findings; MiB = 2**20 bytes
  (none)                    count       counts: ``workers.count``, ``device.ooms``,
                                        ``device.alloc_retries``, ``steps_to_oom``
  ``_s``                    seconds     ``seconds_to_oom``
  ========================  ==========  =============================================

  Levels use GiB because that is how people size devices; rates use MiB per step because a leak
  of a few KiB per step would print as ``0.000003`` in GiB.
* Findings: ``memwatch/findings/count`` (new findings at this epoch end),
  ``memwatch/findings/<kind>`` (how many of that kind), and per finding with a rate
  ``memwatch/findings/<kind>.<metric>_mib_per_step`` / ``..._steps_to_oom`` /
  ``..._seconds_to_oom_s``.

NaN values (a probe that has no reading yet, or a disabled probe) are dropped rather than logged:
loggers treat NaN inconsistently and a gap in a chart is the honest picture.

The keys every integration logs (each adapter's docstring adds its own):

==================================================  ==============================================
key                                                 meaning
==================================================  ==============================================
``memwatch/host.rss_gib``                           this process's resident memory (per step)
``memwatch/host.uss_gib``, ``host.pss_gib``         private / proportional memory (background)
``memwatch/host.rss_anon_gib``, ``.rss_file_gib``   RSS by kind: anonymous, file-backed (mapped
``memwatch/host.rss_shmem_gib``                     files), shared memory (background)
``memwatch/device.allocated_gib`` ...               accelerator allocator counters (CUDA/MPS)
``memwatch/workers.count``, ``workers.uss_gib``     live DataLoader workers and their memory
``memwatch/cgroup.working_set_gib``, ``.usage_gib``  the job's memory cgroup (background)
``memwatch/cgroup.oom_kills``                       processes the kernel's OOM killer killed
``memwatch/system.available_gib``                   the machine's ``MemAvailable``
``memwatch/<stage>/<metric>_gib``, ``.peak_gib``    an evaluation loop: last value and peak
``memwatch/findings/count``, ``/<kind>``            new findings at a check, and of each kind
``memwatch/findings/<kind>.<metric>_mib_per_step``  growth rate of a finding
``memwatch/rank<r>/<metric>.peak_gib``, ``.floor``  rank 0 of a distributed run: every rank's
``memwatch/ranks/<metric>.imbalance``               figures, and highest peak / lowest peak
``memwatch/oom``                                    1 when a run died and left a bundle
==================================================  ==============================================

Example::

    >>> from memwatch.core.metrics import log_key, to_log_metrics
    >>> log_key("host.rss")
    'memwatch/host.rss_gib'
    >>> log_key("workers.count", stage="val")
    'memwatch/val/workers.count'
    >>> to_log_metrics({"host.rss": 2.0 * 2**30, "workers.count": 2.0})
    {'memwatch/host.rss_gib': 2.0, 'memwatch/workers.count': 2.0}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memwatch.core.units import GIB, MIB

PREFIX = "memwatch"

#: Stages that get their own key segment; ``"train"`` maps to no segment.
STAGES: tuple[str, ...] = ("train", "val", "test", "predict")

#: Metrics that are counts, not bytes: logged as they are, without a unit suffix.
COUNT_METRICS: frozenset[str] = frozenset(
    {"workers.count", "device.ooms", "device.alloc_retries", "cgroup.oom_kills",
     "cgroup.oom_kills_local"}
)
# Future probes that follow the same convention are recognised by their last name segment.
_COUNT_SUFFIXES: tuple[str, ...] = (".count", ".ooms", ".retries", ".alloc_retries", ".objects")


def is_count(metric: str) -> bool:
    """True when ``metric`` counts things (no unit) rather than bytes."""
    return metric in COUNT_METRICS or metric.endswith(_COUNT_SUFFIXES)


def unit_suffix(metric: str) -> str:
    """``'_gib'`` for byte metrics, ``''`` for counts."""
    return "" if is_count(metric) else "_gib"


def _stage_prefix(stage: str, prefix: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: use one of {STAGES}")
    return prefix if stage == "train" else f"{prefix}/{stage}"


def log_key(metric: str, stage: str = "train", prefix: str = PREFIX) -> str:
    """The logger key of memwatch metric ``metric`` (a timeline key such as ``'host.rss'``)."""
    return f"{_stage_prefix(stage, prefix)}/{metric}{unit_suffix(metric)}"


def log_value(metric: str, value: float) -> float:
    """``value`` (bytes or a count) converted to the unit :func:`log_key` names."""
    return float(value) if is_count(metric) else float(value) / GIB


def to_log_metrics(
    sample: Mapping[str, float], stage: str = "train", prefix: str = PREFIX
) -> dict[str, float]:
    """A whole sample (metric -> bytes/count) as logger keys and units, NaNs dropped."""
    head = _stage_prefix(stage, prefix)
    out: dict[str, float] = {}
    for metric, value in sample.items():
        if value is None or math.isnan(value):
            continue
        if is_count(metric):
            out[f"{head}/{metric}"] = float(value)
        else:
            out[f"{head}/{metric}_gib"] = float(value) / GIB
    return out


def findings_metrics(
    findings: Iterable[Any], stage: str = "train", prefix: str = PREFIX
) -> dict[str, float]:
    """Numeric summary of findings (objects with ``kind``, ``metric`` and the rate fields).

    Always contains ``<prefix>/findings/count`` (possibly 0), so a chart of it shows the epochs
    where nothing was found as well.
    """
    head = f"{_stage_prefix(stage, prefix)}/findings"
    out: dict[str, float] = {f"{head}/count": 0.0}
    for f in findings:
        out[f"{head}/count"] += 1.0
        kind = str(getattr(f, "kind", "unknown"))
        out[f"{head}/{kind}"] = out.get(f"{head}/{kind}", 0.0) + 1.0
        base = f"{head}/{kind}.{getattr(f, 'metric', 'unknown')}"
        rate = getattr(f, "bytes_per_step", None)
        if rate is not None and not math.isnan(rate):
            out[f"{base}_mib_per_step"] = float(rate) / MIB
        steps = getattr(f, "steps_to_oom", None)
        if steps is not None and not math.isnan(steps) and not math.isinf(steps):
            out[f"{base}_steps_to_oom"] = float(steps)
        secs = getattr(f, "seconds_to_oom", None)
        if secs is not None and not math.isnan(secs) and not math.isinf(secs):
            out[f"{base}_seconds_to_oom_s"] = float(secs)
    return out


#: Columns of the findings table logged where a logger supports tables (W&B) or text: one
#: row per verdict, ``step`` the optimizer step of the check that said it.
FINDING_COLUMNS: tuple[str, ...] = (
    "step",
    "stage",
    "kind",
    "metric",
    "severity",
    "mib_per_step",
    "steps_to_oom",
    "culprit",
    "message",
    "state",
    "history",
)


def finding_row(finding: Any, stage: str = "train", history: str | None = None) -> list[Any]:
    """One row of the findings table, in :data:`FINDING_COLUMNS` order (JSON-able values):
    ``state`` is the state the finding gives its belief (``leak``, ``bounded``, ``stopped`` or
    its kind), ``history`` how that belief came to it (None: it never changed)."""
    rate = getattr(finding, "bytes_per_step", None)
    steps = getattr(finding, "steps_to_oom", None)
    ev = getattr(finding, "evidence", None) or {}
    return [
        getattr(finding, "step", None),
        stage,
        getattr(finding, "kind", None),
        getattr(finding, "metric", None),
        getattr(finding, "severity", None),
        None if rate is None else round(float(rate) / MIB, 6),
        None if steps is None or math.isinf(steps) else float(steps),
        getattr(finding, "culprit", None),
        getattr(finding, "message", None),
        ev.get("belief_state") or getattr(finding, "kind", None),
        history,
    ]


def check_metrics(report: Any, train_keys: bool = True) -> dict[str, float]:
    """The logger row of one check (a :class:`memwatch.core.protocols.CheckReport`). Training:
    the findings' counts and rates (unless ``train_keys`` is False: a memwatch W&B sink writes
    those) and rank 0's per-rank figures. Evaluation: the loop's last and peak values and its
    findings, under ``memwatch/<stage>/``."""
    out: dict[str, float] = {}
    if report.stage == "train":
        if train_keys:
            out.update(findings_metrics(report.findings))
        if report.rank_summaries:
            out.update(rank_log_metrics(report.rank_summaries, PREFIX))
        return out
    s = report.summary
    if s is not None:
        last = {k: float(s.last[i]) for i, k in enumerate(s.keys)}
        peak = {f"{k}.peak": float(s.peak[i]) for i, k in enumerate(s.keys) if not is_count(k)}
        out.update(to_log_metrics({**last, **peak}, stage=report.stage))
    out.update(findings_metrics(report.findings, stage=report.stage))
    return out


def rank_metrics(summaries: Sequence[dict[str, Any] | None]) -> dict[str, float]:
    """Per-rank series for loggers: ``rank<r>/<metric>_peak`` and ``..._floor`` in bytes, plus the
    peak imbalance (max/min) of the first metric every rank has."""
    out: dict[str, float] = {}
    alive = [s for s in summaries if s is not None]
    for s in alive:
        r = int(s["rank"])
        for m, v in s["peak"].items():
            out[f"rank{r}/{m}.peak"] = v
        for m, v in s["floor"].items():
            out[f"rank{r}/{m}.floor"] = v
    for m in ("device.peak", "device.allocated", "host.rss"):
        vals = [s["peak"][m] for s in alive if m in s["peak"]]
        if len(vals) == len(alive) and len(vals) > 1 and min(vals) > 0:
            out[f"ranks/{m}.imbalance"] = max(vals) / min(vals)
            break
    return out


def rank_log_metrics(summaries: Sequence[dict[str, Any] | None],
                     prefix: str = PREFIX) -> dict[str, float]:
    """:func:`rank_metrics` as logger keys with units: ``memwatch/rank1/host.rss.peak_gib``
    (GiB = 2**30) and the unitless ``memwatch/ranks/host.rss.imbalance``."""
    out: dict[str, float] = {}
    for k, v in rank_metrics(summaries).items():
        if k.endswith(".imbalance"):
            out[f"{prefix}/{k}"] = v
        else:
            out[f"{prefix}/{k}_gib"] = v / GIB
    return out
