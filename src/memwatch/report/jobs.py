"""Bundles of one distributed job, side by side: who failed first, and how the others looked then.

Every rank writes its own bundles. Each manifest records the job (``job.id``: the launcher's id,
``torchelastic-<run id>``, ``slurm-<job>``, ``MEMWATCH_JOB_ID`` or, with none of these, an id rank 0
made up and sent to every rank at start), its rank and world size. :func:`group_jobs` puts the
bundles of one job (and one torchelastic restart attempt) together; :func:`compare` finds the
first failure (an exception or an OOM caught by the allocator's observer; a signal or watchdog
bundle only when there is none) and reads, from every other rank's timeline, the last sample taken
at or before that moment.

Bundles written before job ids were recorded are grouped by the launcher variables kept in their
``environment.json``. Groups keyed only by the rendezvous address (``master-<addr>:<port>``, which
later jobs reuse) are split where bundles are more than :data:`WEAK_KEY_GAP_S` apart.

Example::

    >>> from memwatch.report.jobs import job_key
    >>> job_key({"job": {"id": "torchelastic-ab12", "source": "TORCHELASTIC_RUN_ID",
    ...                  "attempt": 0}, "world_size": 2}, {})
    ('torchelastic-ab12', 0, 'TORCHELASTIC_RUN_ID')
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path
from typing import Any

from memwatch.bundle import Bundle
from memwatch.core.errors import BundleError
from memwatch.core.oom import PEER_FAILURE
from memwatch.core.units import fmt_bytes
from memwatch.report.data import finite  # finite number or None, as the report reads values
from memwatch.report.peers import named_first, peer_note
from memwatch.report.text import shorten

__all__ = ["FAILURE_TRIGGERS", "LATE_TRIGGERS", "WEAK_KEY_GAP_S", "Job", "JobComparison",
           "RankAtFailure", "RankBundle", "compare", "group_jobs", "job_key", "render_comparison",
           "when"]

#: Triggers that mean "this rank failed", in order of preference for the first failure.
FAILURE_TRIGGERS: tuple[str, ...] = ("exception", "oom_observer")
#: Triggers that follow a failure elsewhere (the launcher's SIGTERM) or precede one (watchdog).
LATE_TRIGGERS: tuple[str, ...] = ("watchdog", "signal")
#: Bundles of a job known only by its rendezvous address further apart than this are two jobs.
WEAK_KEY_GAP_S = 1800.0
#: Metrics compared across ranks, in display order.
COMPARED: tuple[str, ...] = ("device.allocated", "device.reserved", "host.rss", "workers.uss")


@dataclasses.dataclass
class RankBundle:
    """One bundle, with what grouping needs from its manifest."""

    path: Path
    bundle: Bundle
    rank: int
    world_size: int
    host: str
    time: float  # when the failure was captured (unix seconds)
    trigger: str
    classification: str | None

    @property
    def is_failure(self) -> bool:
        return self.trigger in FAILURE_TRIGGERS

    @property
    def is_own_failure(self) -> bool:
        """A failure of this rank's own, not its collective losing a peer that failed."""
        return self.is_failure and self.classification != PEER_FAILURE


@dataclasses.dataclass
class Job:
    """The bundles of one job (one restart attempt), oldest first."""

    id: str
    attempt: int | None
    source: str | None
    world_size: int
    bundles: list[RankBundle]

    @property
    def label(self) -> str:
        return self.id + (f" (attempt {self.attempt})" if self.attempt else "")

    @property
    def ranks(self) -> list[int]:
        return sorted({b.rank for b in self.bundles})

    @property
    def hosts(self) -> list[str]:
        """The hosts (nodes) the bundles came from, in order of first appearance."""
        return list(dict.fromkeys(b.host for b in self.bundles))

    @property
    def missing_ranks(self) -> list[int]:
        have = set(self.ranks)
        return [r for r in range(self.world_size) if r not in have]

    def first_failure(self) -> RankBundle:
        """The earliest failure of a rank's own; else the earliest peer failure (the rank that
        failed first left no bundle); else the earliest watchdog/signal bundle; else the first."""
        for tier in ((lambda b: b.is_own_failure), (lambda b: b.is_failure),
                     (lambda b: b.trigger in LATE_TRIGGERS)):
            cands = [b for b in self.bundles if tier(b)]
            if cands:
                return min(cands, key=lambda b: b.time)
        return self.bundles[0]


def _env_of(bundle: Bundle) -> dict[str, str]:
    try:
        env = bundle.read_json("environment.json", {}) or {}
    except BundleError:
        return {}
    got = env.get("env") if isinstance(env, dict) else None
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def job_key(manifest: dict[str, Any], env: dict[str, str]) -> tuple[str, int | None, str | None]:
    """``(id, attempt, source)`` of the job a bundle belongs to; id ``""`` when none is known.

    The manifest's ``job`` comes first; bundles written before it existed fall back to the launcher
    variables in ``environment.json``.
    """
    job = manifest.get("job")
    if isinstance(job, dict) and job.get("id"):
        att = job.get("attempt")
        return str(job["id"]), att if isinstance(att, int) else None, job.get("source")
    from memwatch.runtime.exchange import job_identity

    ident = job_identity(env)
    if ident["id"] is not None and "WORLD_SIZE" not in env:
        env = {**env, "WORLD_SIZE": str(manifest.get("world_size", 1))}
        ident = job_identity(env)
    return (str(ident["id"]) if ident["id"] else "", ident["attempt"], ident["source"])


def _captured_at(bundle: Bundle) -> float:
    m = bundle.manifest
    try:
        mem = bundle.read_json("memory.json", {}) or {}
        t = mem.get("captured_at_unix") if isinstance(mem, dict) else None
    except BundleError:
        t = None
    if not isinstance(t, (int, float)):
        t = m.get("created_unix")
    return float(t) if isinstance(t, (int, float)) else 0.0


def _as_int(v: Any, default: int) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else default


def group_jobs(entries: list[tuple[Path, Bundle | BundleError]]
               ) -> tuple[list[Job], list[tuple[Path, Bundle | BundleError]]]:
    """Split :func:`memwatch.bundle.find_bundles` output into multi-rank jobs and the rest.

    A job is the bundles sharing a job id and attempt whose world size is above 1. Everything
    else (single-process bundles, unreadable ones) is returned as it came, in order.
    """
    groups: dict[tuple[str, int | None], list[RankBundle]] = {}
    sources: dict[tuple[str, int | None], str | None] = {}
    rest: list[tuple[Path, Bundle | BundleError]] = []
    for path, b in entries:
        if not isinstance(b, Bundle):
            rest.append((path, b))
            continue
        m = b.manifest
        world = _as_int(m.get("world_size"), 1)
        has_job = isinstance(m.get("job"), dict) and bool(m["job"].get("id"))
        # environment.json is read only for bundles written before manifests named the job
        jid, attempt, source = job_key(m, {} if has_job else _env_of(b))
        if world <= 1 or not jid:
            rest.append((path, b))
            continue
        cls = m.get("classification")
        node = m["node"] if isinstance(m.get("node"), dict) else {}
        rb = RankBundle(path=path, bundle=b, rank=_as_int(m.get("rank"), 0), world_size=world,
                        host=str(node.get("name") or m.get("host", "?")), time=_captured_at(b),
                        trigger=str(m.get("trigger", "?")),
                        classification=cls.get("kind") if isinstance(cls, dict) else cls)
        groups.setdefault((jid, attempt), []).append(rb)
        sources[(jid, attempt)] = source
    jobs: list[Job] = []
    for (jid, attempt), bs in groups.items():
        bs.sort(key=lambda b: b.time)
        parts = [bs]
        if sources[(jid, attempt)] == "MASTER_ADDR":  # a reused port: split at long gaps
            parts = [[bs[0]]]
            for rb in bs[1:]:
                if rb.time - parts[-1][-1].time > WEAK_KEY_GAP_S:
                    parts.append([])
                parts[-1].append(rb)
        for i, part in enumerate(parts):
            label = jid if len(parts) == 1 else f"{jid}#{i + 1}"
            jobs.append(Job(id=label, attempt=attempt, source=sources[(jid, attempt)],
                            world_size=max(b.world_size for b in part), bundles=part))
    jobs.sort(key=lambda j: j.bundles[0].time)
    return jobs, rest


# --------------------------------------------------------------------------- comparison
@dataclasses.dataclass
class RankAtFailure:
    """One rank at the moment the first rank failed."""

    rank: int
    host: str | None
    events: list[str]  # this rank's own bundles: "+2.1 s signal", "failed first: host_oom"
    sample: dict[str, Any] | None  # last sample at or before the moment (None: none by then)
    sample_age_s: float | None
    limits: dict[str, float]
    findings: list[dict[str, Any]]  # this rank's leak / near-OOM findings known by then
    source: str  # "timeline" (its own bundle), "exchange" (rank 0's ranks.json), "none"
    path: Path | None


@dataclasses.dataclass
class JobComparison:
    job: Job
    first: RankBundle
    headline: str
    message: str | None
    ranks: list[RankAtFailure]
    metrics: list[str]
    notes: list[str]


def _read_timeline(b: Bundle) -> list[dict[str, Any]]:
    try:
        return [r for r in b.timeline() if r.get("type") == "sample"]
    except BundleError:
        return []


def _sample_at(samples: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    best = None
    for s in samples:
        st = s.get("t")
        if isinstance(st, (int, float)) and st <= t:
            best = s
    return best


def _rank_findings(b: Bundle) -> list[dict[str, Any]]:
    try:
        fs = b.read_json("findings.json", []) or []
    except BundleError:
        return []
    latest: dict[tuple[Any, Any], dict[str, Any]] = {}  # each epoch end repeats a finding
    for f in fs:
        if isinstance(f, dict) and f.get("kind") in ("leak", "near_oom", "rank_leak",
                                                     "fragmentation"):
            latest.pop((f.get("kind"), f.get("metric")), None)
            latest[(f.get("kind"), f.get("metric"))] = f
    return list(latest.values())[-3:]


def compare(job: Job) -> JobComparison:
    """The first failure of ``job`` and every rank's state at that moment."""
    from memwatch.report.summary import summarize

    first = job.first_failure()
    t0 = first.time
    summary = summarize(first.bundle)
    exc = summary.exception or {}
    message = None
    if exc.get("type"):
        lines = str(exc.get("message") or "").strip().splitlines()
        message = f"{exc['type']}: {lines[0] if lines else ''}".rstrip(": ")
    by_rank: dict[int, list[RankBundle]] = {}
    for b in job.bundles:
        by_rank.setdefault(b.rank, []).append(b)
    exchange: dict[int, dict[str, Any]] = {}
    for b in job.bundles:  # rank 0's record of the last epoch-end exchange
        try:
            doc = b.bundle.read_json("ranks.json")
        except BundleError:
            doc = None
        if isinstance(doc, dict):
            for s in doc.get("summaries") or []:
                if isinstance(s, dict) and isinstance(s.get("rank"), int):
                    prev = exchange.get(s["rank"])
                    if prev is None or (s.get("time") or 0) >= (prev.get("time") or 0):
                        exchange[s["rank"]] = s
    rows: list[RankAtFailure] = []
    seen_metrics: set[str] = set()
    for r in range(job.world_size):
        own = by_rank.get(r, [])
        events = []
        for b in own:
            what = f"{b.classification} ({b.trigger})" if b.classification else b.trigger
            events.append(f"failed first: {what}" if b is first
                          else f"{b.time - t0:+.1f} s: {what}")
        if own:
            # The bundle written closest after the moment holds the samples leading up to it.
            after = [b for b in own if b.time >= t0 - 0.5]
            src = min(after, key=lambda b: b.time) if after else max(own, key=lambda b: b.time)
            samples = _read_timeline(src.bundle)
            s = _sample_at(samples, t0)
            try:
                mem = src.bundle.read_json("memory.json", {}) or {}
            except BundleError:
                mem = {}
            limits = {k: float(v) for k, v in (mem.get("limits") or {}).items()
                      if isinstance(v, (int, float))}
            if s is not None:
                seen_metrics.update(k for k in COMPARED if finite(s.get(k)) is not None)
            rows.append(RankAtFailure(
                rank=r, host=src.host, events=events, sample=s,
                sample_age_s=(t0 - float(s["t"])) if s is not None else None, limits=limits,
                findings=_rank_findings(src.bundle), source="timeline", path=src.path))
            continue
        ex = exchange.get(r)
        if ex is not None:
            sample = {f"{k}": v for k, v in (ex.get("peak") or {}).items()}
            sample["step"] = ex.get("step")
            seen_metrics.update(k for k in COMPARED if finite(sample.get(k)) is not None)
            t = ex.get("time")
            rows.append(RankAtFailure(
                rank=r, host=ex.get("host"), events=["no bundle"], sample=sample,
                sample_age_s=(t0 - float(t)) if isinstance(t, (int, float)) else None,
                limits={k: float(v) for k, v in (ex.get("limits") or {}).items()},
                findings=list(ex.get("findings") or []), source="exchange", path=None))
        else:
            rows.append(RankAtFailure(rank=r, host=None, events=["no bundle"], sample=None,
                                      sample_age_s=None, limits={}, findings=[], source="none",
                                      path=None))
    rows.sort(key=lambda x: (x.rank != first.rank, x.rank))
    notes = []
    blind = [str(x.rank) for x in rows if x.source == "timeline" and x.sample is None]
    if blind:
        notes.append(f"Rank(s) {', '.join(blind)}: no sample at or before that moment in their "
                     "bundle (their timeline starts later, or was trimmed).")
    peer = sorted({b.rank for b in job.bundles if b.is_failure and not b.is_own_failure})
    if peer:
        notes.append(peer_note(peer, first.rank, first.is_own_failure,
                               named_first(b.bundle.manifest for b in job.bundles)))
    if job.missing_ranks:
        notes.append(f"No bundle from rank(s) {', '.join(map(str, job.missing_ranks))}: killed "
                     "without a chance to write (SIGKILL), bundles off, or still running."
                     + (" Rows marked 'exchange' are that rank's peaks at the last exchange (a "
                        "check), from rank 0's ranks.json."
                        if any(x.source == "exchange" for x in rows) else ""))
    if len({b.host for b in job.bundles}) > 1:
        notes.append("Ranks ran on several hosts: 'at that moment' relies on their clocks "
                     "agreeing (NTP); offsets of a second or two are normal.")
    return JobComparison(job=job, first=first, headline=summary.headline, message=message,
                         ranks=rows, metrics=[k for k in COMPARED if k in seen_metrics],
                         notes=notes)


def when(m: dict[str, Any]) -> str:
    """``epoch 3, step 132`` from a manifest; ``step 132`` for a loop without epochs."""
    epoch = m.get("epoch")
    lead = f"epoch {epoch}, " if isinstance(epoch, int) and epoch > 0 else ""
    return f"{lead}step {m.get('step', '?')}"


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(s: dict[str, Any] | None, metric: str, limits: dict[str, float]) -> str:
    v = finite(s.get(metric)) if s is not None else None
    if v is None:
        return "-"
    lim = limits.get(metric)
    if not lim:
        return fmt_bytes(v)
    return fmt_bytes(v) + (f" ({v / lim:.0%})" if v / lim >= 0.01 else " (<1%)")


def render_comparison(c: JobComparison) -> str:
    """Plain text for ``memwatch inspect DIR``."""
    j, f = c.job, c.first
    m = f.bundle.manifest
    out = [f"memwatch job {j.label}: world size {j.world_size}, bundles from rank(s) "
           f"{', '.join(map(str, j.ranks))} (job id from {j.source or 'the bundles'})", ""]
    lead = (f"Rank {f.rank} failed first" if f.is_own_failure or f.trigger in LATE_TRIGGERS
            else f"No rank's own failure was recorded; first: rank {f.rank}'s collective lost a "
            "peer" if f.is_failure else
            f"No rank failed (manual or end-of-run bundles only); the first is rank {f.rank}'s")
    out.append(f"{lead}, at {_utc(f.time)} on host {f.host} ({when(m)}):")
    out.append(f"  {c.headline}")
    if c.message:
        out.append(f"  {shorten(c.message, 300)}")
    out.append("")
    out.append(f"Every rank at that moment (the last sample at or before {_utc(f.time)[11:]}; "
               "percentages are of the rank's limit):")
    head = ["rank", "host", "step", "sample age"] + c.metrics + ["its bundles"]
    table = [head]
    for r in c.ranks:
        s = r.sample
        step = s.get("step") if s is not None else None
        age = ("-" if r.sample_age_s is None else
               f"{r.sample_age_s:.1f} s" + (" (exchange)" if r.source == "exchange" else ""))
        table.append([str(r.rank), r.host or "?", "-" if step is None else str(step), age]
                     + [_cell(s, k, r.limits) for k in c.metrics] + ["; ".join(r.events)])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    left = {1, len(head) - 1}  # host and events read left to right; numbers line up right
    for row in table:
        out.append("  " + "  ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
                                    for i, cell in enumerate(row)).rstrip())
    flagged = [(r.rank, fd) for r in c.ranks for fd in r.findings]
    if flagged:
        out.append("")
        out.append("Leak findings of each rank (as its bundle recorded them):")
        for rank, fd in flagged:
            rate = fd.get("bytes_per_step")
            rate_s = f", {fmt_bytes(rate)}/step" if isinstance(rate, (int, float)) else ""
            culprit = fd.get("culprit")
            out.append(f"  rank {rank}: {fd.get('kind')} on {fd.get('metric')}{rate_s}"
                       + (f" - {shorten(culprit, 160)}" if culprit else ""))
    for n in c.notes:
        out.append("")
        out.append(n)
    out.append("")
    out.append(f"Full view of the first failure: memwatch inspect {f.path}")
    return "\n".join(out) + "\n"
