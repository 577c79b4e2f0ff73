"""Mapped files: RSS that grows by pages of memory-mapped files is not a leak.

Reading a dataset through ``np.memmap``, Arrow (Hugging Face ``datasets``), ``safetensors`` or
weights loaded with ``mmap=True`` maps the file and faults its pages in as they are read: they
count in RSS, but they are page cache the kernel drops (or writes back) as soon as memory is
needed. RSS then grows steadily while anonymous memory is flat, which the leak rules would call a
leak or allocator retention. The host probe's background read of ``/proc/self/status`` splits
RSS into ``host.rss_anon``, ``host.rss_file`` and ``host.rss_shmem``; when file-backed pages are
most of a ``host.rss`` growth the leak rule judged, this module says so (``mapped_file``, info),
and the leak rule (:mod:`.rule`, which runs this part) judges the anonymous and shared-memory
parts on their own, so a real leak beside a mapped file is still reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.rules.base import SubRule
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding
from memwatch.core.units import fmt_bytes

__all__ = ["FILE", "PART", "PARTS", "RssSplitGrowth", "judge_growth", "parts_history",
           "split_growth"]

#: This part of the leak rule, as its findings name it.
PART = SubRule(name="mapped_file", kinds=frozenset({"mapped_file"}))

#: File-backed resident pages (``RssFile``).
FILE = "host.rss_file"
#: The parts of RSS the kernel cannot drop: judged on their own when file pages are split off.
PARTS = ("host.rss_anon", "host.rss_shmem")
_UNITS = 3  # the stretch: the floors of the last (up to) three units, as the leak rules use


@dataclasses.dataclass(frozen=True)
class RssSplitGrowth:
    """Growth of ``host.rss`` and of its parts over one stretch (floor to floor), in bytes."""

    units: tuple[str, ...]
    steps: int
    rss: float
    file: float
    file_threshold: float
    anon: float | None
    anon_threshold: float | None
    shmem: float | None
    file_now: float

    @property
    def file_share(self) -> float:
        return self.file / self.rss if self.rss > 0 else 0.0

    def file_explains(self, cfg: AnalyzerConfig) -> bool:
        """File-backed pages grew past their noise and are at least ``mapped_file_share`` of
        the RSS growth."""
        return self.rss > 0 and self.file > self.file_threshold and \
            self.file >= cfg.mapped_file_share * self.rss


def _growth(hist: list[EpochStats] | None, first: str, last: str
            ) -> tuple[float, float] | None:
    """(floor growth from unit ``first`` to unit ``last``, largest noise threshold between)."""
    if not hist:
        return None
    by_unit = {h.unit: h for h in hist}
    a, b = by_unit.get(first), by_unit.get(last)
    if a is None or b is None:
        return None
    units = [h.unit for h in hist]
    between = hist[units.index(first):units.index(last) + 1] or [a, b]
    return b.floor - a.floor, max(h.threshold for h in between)


def split_growth(history: Mapping[str, list[EpochStats]]) -> RssSplitGrowth | None:
    """How ``host.rss`` and its parts grew over the last (up to) three units judged, floor to
    floor; None without the split (off Linux, a kernel before 4.5, too few units)."""
    rss = history.get("host.rss")
    if not rss or len(rss) < 2:
        return None
    stretch = rss[-min(_UNITS, len(rss)):]
    first, last = stretch[0].unit, stretch[-1].unit
    file = _growth(history.get(FILE), first, last)
    if file is None:
        return None
    parts = parts_history(history)  # their noise is RSS's (see there)
    anon = _growth(parts.get("host.rss_anon"), first, last)
    shmem = _growth(parts.get("host.rss_shmem"), first, last)
    file_hist = history[FILE]
    return RssSplitGrowth(
        units=tuple(h.unit for h in stretch),
        steps=sum(h.n_steps for h in stretch[:-1]),
        rss=stretch[-1].floor - stretch[0].floor,
        file=file[0], file_threshold=file[1],
        anon=None if anon is None else anon[0],
        anon_threshold=None if anon is None else anon[1],
        shmem=None if shmem is None else shmem[0],
        file_now=file_hist[-1].lo_end,
    )


def judge_growth(history: Mapping[str, list[EpochStats]], ctx: CheckContext,
                 cfg: AnalyzerConfig,
                 mapped_files: Callable[[], list[tuple[str, float]] | None]) -> Finding | None:
    """A ``mapped_file`` finding when file-backed pages explain the ``host.rss`` growth the leak
    rules judged, else None (RSS is then judged as one, as without the split)."""
    g = split_growth(history)
    if g is None or not g.file_explains(cfg):
        return None
    files = mapped_files()
    # File-backed pages are also the code of the libraries the process runs: the first steps
    # and the first checks fault in tens of MiB of them. Only pages of data files (what
    # ``smaps`` lists once libraries are left out) are a mapped dataset being read. (None: the
    # system cannot list them; the file pages' share alone decides.)
    if files is not None and sum(b for _, b in files) < cfg.mapped_file_share * g.file:
        return None
    return _finding(ctx, g, (files or [])[:5])


def parts_history(history: Mapping[str, list[EpochStats]]) -> dict[str, list[EpochStats]]:
    """``history`` with each part's noise threshold raised to RSS's in the same unit.

    The parts are read in the background (every ``interval_s`` and after each check), so within
    a short unit their series is a few flat reads: no noise shows, which is not the absence of
    noise (memwatch's own checks, a census, allocator pools settling all move them). A part is
    judged with the noise of the whole it belongs to, so splitting RSS never makes a verdict
    more sensitive than judging RSS as one would have been.
    """
    rss = {h.unit: h.threshold for h in history.get("host.rss", [])}
    out = dict(history)
    for part in PARTS:
        if part in history:
            out[part] = [dataclasses.replace(h, threshold=max(h.threshold, rss.get(h.unit, 0.0)))
                         for h in history[part]]
    return out


def _finding(ctx: CheckContext, g: RssSplitGrowth, files: list[tuple[str, float]]) -> Finding:
    span = f"across {len(g.units)} checks" if g.units[-1].startswith("s") else \
        f"over {len(g.units)} epochs"
    msg = (
        f"This process's resident memory (RSS) grew by {fmt_bytes(g.rss)} {span}, and its "
        f"file-backed pages (host.rss_file) by {fmt_bytes(g.file)} over the same stretch: pages "
        "of memory-mapped files the process has read, such as an np.memmap, an Arrow / Hugging "
        "Face dataset, safetensors or model weights loaded with mmap. They count in RSS but are "
        "page cache: the kernel drops them (writing dirty ones back first) as soon as memory is "
        "needed. This is not a leak and not allocator retention."
    )
    if g.anon is not None and g.anon_threshold is not None:
        if g.anon <= g.anon_threshold:
            msg += (f" Anonymous memory (host.rss_anon) changed by {fmt_bytes(g.anon)} over "
                    f"the same stretch, within its noise ({fmt_bytes(g.anon_threshold)}).")
        else:
            msg += (f" Anonymous memory (host.rss_anon) grew by {fmt_bytes(g.anon)} over the "
                    "same stretch: it is judged on its own (a leak there is reported on "
                    "host.rss_anon).")
    msg += (" The limits that matter are anonymous memory and the memory cgroup's working set "
            "(cgroup.working_set), which leaves reclaimable page cache out.")
    culprit = None
    if files:  # the few that matter: locale files and caches are mapped too
        culprit = "mapped files: " + ", ".join(
            f"{_short_path(p)} ({fmt_bytes(b)} resident)" for p, b in files[:3]
            if b >= 0.1 * files[0][1])
    return ctx.origin.finding(
        rule=PART.name, kind="mapped_file", metric="host.rss", severity="info", message=msg,
        bytes_per_step=g.file / g.steps if g.steps > 0 else None, culprit=culprit,
        suggestions=[
            "Usually nothing: these pages are reclaimable page cache, and a mapped dataset "
            "that fills RSS up to the machine's memory is normal. Watch host.rss_anon and "
            "cgroup.working_set for real pressure (memwatch's watchdog leaves file-backed "
            "pages out of the host limit).",
            "If RSS itself must stay flat (a scheduler that kills on RSS): open a fresh map per "
            "epoch or per batch (a new `np.memmap(...)` in each `get_batch`, as nanoGPT does) "
            "and drop the old one, release the pages you are done with "
            "(`mmap.madvise(mmap.MADV_DONTNEED)`), or read batches with "
            "`np.fromfile(path, dtype, count=..., offset=...)` instead of mapping the file.",
        ],
        evidence={
            "units": list(g.units),
            "rss_growth_bytes": g.rss,
            "file_growth_bytes": g.file,
            "file_share": g.file_share,
            "file_threshold_bytes": g.file_threshold,
            "anon_growth_bytes": g.anon,
            "anon_threshold_bytes": g.anon_threshold,
            "shmem_growth_bytes": g.shmem,
            "rss_file_bytes": g.file_now,
            "mapped_files": [{"path": p, "resident_bytes": b} for p, b in files],
        },
    )


def _short_path(path: str) -> str:
    """The last two components of a path: enough to recognise a dataset file.

    Example::

        >>> _short_path("/data/openwebtext/train.bin"), _short_path("/x.bin")
        ('openwebtext/train.bin', '/x.bin')
    """
    parts = path.rstrip("/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path
