"""What a person wants to know first about a bundle, computed once for every renderer.

Both ``memwatch inspect`` (terminal) and ``report.html`` render this summary, so they never
disagree: what ran out, how full memory was, the largest live tensors and their holders, the
findings and the last minutes of the timeline.

Example::

    >>> import memwatch
    >>> from memwatch.bundle import open_bundle
    >>> from memwatch.report.summary import summarize
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=tmp, signals=False) as mw:
    ...     mw.step()
    ...     path = mw.dump("a look")
    >>> s = summarize(open_bundle(path))
    >>> s.headline, len(s.samples)
    ('Bundle written on manual.', 1)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from memwatch.bundle import Bundle
from memwatch.core.oom import PEER_FAILURE
from memwatch.core.units import fmt_bytes
from memwatch.report.peers import named_first, peer_who

__all__ = ["Summary", "summarize"]

# Timeline metrics shown, in order of interest, when present.
SHOWN_METRICS: tuple[str, ...] = ("device.allocated", "device.reserved", "host.rss", "host.uss",
                                  "workers.rss", "workers.uss", "cgroup.working_set")
MAX_TIMELINE_POINTS = 400
TAIL_SECONDS = 300.0


@dataclasses.dataclass
class Summary:
    """A bundle digested for display."""

    path: str
    manifest: dict[str, Any]
    headline: str
    exception: dict[str, Any] | None
    fullness: list[dict[str, Any]]  # [{scope, metric, value, limit, utilization}]
    top_tensors: list[dict[str, Any]]
    census_note: str | None
    findings: list[dict[str, Any]]
    environment: dict[str, Any]
    allocator: dict[str, Any] | None
    keys: list[str]
    samples: list[dict[str, Any]]  # downsampled, for charts
    tail: list[dict[str, Any]]  # the last TAIL_SECONDS of samples, for tables
    epochs: list[dict[str, Any]]
    #: What held the memory that grew since the last check (``census.json["killer"]``: see
    #: :mod:`memwatch.analysis.culprits.killer`); None in bundles without it.
    killer: dict[str, Any] | None = None


def _headline(manifest: dict[str, Any], exc: dict[str, Any] | None) -> str:
    cls = (manifest.get("classification") or {}).get("kind") if isinstance(
        manifest.get("classification"), dict) else manifest.get("classification")
    trigger = manifest.get("trigger", "?")
    what = {
        "cuda_oom": "The GPU ran out of memory (CUDA OOM)",
        "mps_oom": "The Apple GPU ran out of memory (MPS OOM)",
        "host_oom": "The host ran out of memory (host OOM)",
        "peer_failure": "A collective failed because another rank died or never came "
                        "(peer failure)",
        "other": "The run failed with an exception that is not an OOM",
    }.get(str(cls), f"Bundle written on {trigger}")
    first = named_first([manifest]) if cls == PEER_FAILURE else None
    if first is not None:
        what += f": the job's store says {peer_who(first)}"
    nums = (exc or {}).get("numbers") or {}
    if nums.get("kernel_oom_kills"):
        who = (f"DataLoader worker {nums['worker_pid']}" if "worker_pid" in nums
               else "a process of this job")
        what += (f": the kernel's OOM killer killed {who} (the memory cgroup's OOM-kill counter "
                 f"rose by {nums['kernel_oom_kills']} during the run)")
    if "tried_to_allocate" in nums:
        what += f" while allocating {fmt_bytes(nums['tried_to_allocate'])}"
    if "free" in nums and "total_capacity" in nums:
        what += f"; {fmt_bytes(nums['free'])} of {fmt_bytes(nums['total_capacity'])} was free"
    return what + "."


def _fullness(memory: dict[str, Any], exc: dict[str, Any] | None) -> list[dict[str, Any]]:
    latest = memory.get("latest") or {}
    limits = memory.get("limits") or {}
    rows: list[dict[str, Any]] = []
    for metric, limit in sorted(limits.items()):
        if metric not in SHOWN_METRICS:
            continue  # peak/active/pss repeat what allocated/reserved/rss say
        v = latest.get(metric)
        if not isinstance(v, (int, float)) or not isinstance(limit, (int, float)) or limit <= 0:
            continue
        if isinstance(v, float) and math.isnan(v):
            continue
        rows.append({"scope": metric.split(".")[0], "metric": metric, "value": v, "limit": limit,
                     "utilization": v / limit})
    nums = (exc or {}).get("numbers") or {}
    total = nums.get("total_capacity")
    used = nums.get("in_use_by_process")
    if total and used:
        rows.append({"scope": "device", "metric": "in use (from the OOM message)", "value": used,
                     "limit": total, "utilization": used / total})
    aspace = memory.get("address_space") or {}
    if aspace.get("vmsize") and aspace.get("rlimit_as"):
        rows.append({"scope": "host", "metric": "address space (VmSize / RLIMIT_AS)",
                     "value": aspace["vmsize"], "limit": aspace["rlimit_as"],
                     "utilization": aspace["vmsize"] / aspace["rlimit_as"]})
    obs = memory.get("observer") or {}
    if obs.get("device_total") and obs.get("device_free") is not None:
        t, f = obs["device_total"], obs["device_free"]
        rows.append({"scope": "device", "metric": "device used at the OOM (observer)",
                     "value": t - f, "limit": t, "utilization": (t - f) / t})
    return rows


def summarize(bundle: Bundle) -> Summary:
    """Digest a bundle (raises :class:`memwatch.core.errors.BundleError` on corrupted files)."""
    m = bundle.manifest
    exc = bundle.read_json("exception.json")
    memory = bundle.read_json("memory.json", {}) or {}
    census = bundle.read_json("census.json")
    findings = bundle.read_json("findings.json", []) or []
    env = bundle.read_json("environment.json", {}) or {}
    allocator = bundle.read_json("allocator.json")
    keys: list[str] = []
    samples: list[dict[str, Any]] = []
    epochs: list[dict[str, Any]] = []
    for rec in bundle.timeline():
        kind = rec.get("type")
        if kind == "header":
            keys = [str(k) for k in rec.get("keys", [])]
        elif kind == "sample":
            samples.append(rec)
        elif kind == "epoch":
            epochs.append(rec)
    tail: list[dict[str, Any]] = []
    if samples:
        t_last = samples[-1].get("t") or 0.0
        tail = [s for s in samples if (s.get("t") or 0.0) >= t_last - TAIL_SECONDS]
    if len(samples) > MAX_TIMELINE_POINTS:
        stride = math.ceil(len(samples) / MAX_TIMELINE_POINTS)
        samples = samples[::stride] + ([samples[-1]] if (len(samples) - 1) % stride else [])
    top: list[dict[str, Any]] = []
    note: str | None = None
    if isinstance(census, dict):
        if census.get("error"):
            note = f"census unavailable: {census['error']}"
        top = list(census.get("top") or census.get("groups") or [])
    elif "census.json" in (m.get("files") or {}):
        note = "census.json is not an object"
    else:
        trimmed = [t.get("file") for t in m.get("trimmed", []) if isinstance(t, dict)]
        note = "census trimmed to fit the size cap" if "census.json" in trimmed else "no census"
    top = [t for t in top if isinstance(t, dict)]
    _holders_from_findings(top, findings if isinstance(findings, list) else [])
    return Summary(
        path=str(bundle.path),
        manifest=m,
        headline=_headline(m, exc if isinstance(exc, dict) else None),
        exception=exc if isinstance(exc, dict) else None,
        fullness=_fullness(memory if isinstance(memory, dict) else {},
                           exc if isinstance(exc, dict) else None),
        top_tensors=top,
        census_note=note,
        findings=[f for f in findings if isinstance(f, dict)] if isinstance(findings, list) else [],
        environment=env if isinstance(env, dict) else {},
        allocator=allocator if isinstance(allocator, dict) else None,
        keys=keys,
        samples=samples,
        tail=tail,
        epochs=epochs,
        killer=census.get("killer") if isinstance(census, dict) and
        isinstance(census.get("killer"), dict) else None,
    )


def killer_lines(s: Summary) -> list[str]:
    """What held the memory that grew since the last check, one line each (the note first)."""
    k = s.killer
    if not k:
        return []
    out = [str(k.get("note") or "")]
    held_by = k.get("held")
    for e in (held_by if isinstance(held_by, list) else [])[:6]:
        if not isinstance(e, dict):
            continue
        held = f", held by {e['holder']}" if e.get("holder") else ""
        out.append(f"{fmt_bytes(e.get('bytes'))}: {e.get('what', '?')}{held}")
    return out


def tensor_label(t: dict[str, Any]) -> str:
    """``float32[4096x4096] on cpu, grad_fn=MmBackward0``."""
    shape = "x".join(str(s) for s in t.get("shape") or []) or "scalar"
    dtype = str(t.get("dtype", "?")).replace("torch.", "")
    s = f"{dtype}[{shape}] on {t.get('device', '?')}"
    if t.get("grad_fn"):
        s += f", grad_fn={t['grad_fn']}"
    elif t.get("requires_grad"):
        s += ", requires_grad"
    return s


def latest_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The current finding of each belief (:func:`memwatch.analysis.beliefs.current`): the
    analyzer restates a verdict at every check and revises it when the evidence changes (a
    finding saved before beliefs counts as one belief per loop, kind and metric)."""
    from memwatch.analysis.beliefs import current

    return current(findings)


def _group_key(g: dict[str, Any]) -> tuple[str, str, str, str]:
    return (str(g.get("device")), str(g.get("dtype")), str(list(g.get("shape") or [])),
            str(g.get("grad_fn") or ""))


def _holders_from_findings(top: list[dict[str, Any]], findings: list[Any]) -> None:
    """Name the holder of a census group when a leak finding attributed that group already."""
    holders: dict[tuple[str, str, str, str], str] = {}
    for f in findings:
        ev = f.get("evidence") if isinstance(f, dict) else None
        if not isinstance(ev, dict) or not ev.get("holder"):
            continue
        for g in ev.get("growing_groups") or []:
            if isinstance(g, dict):
                holders[_group_key(g)] = f"{ev['holder']} (growing)"
    for t in top:
        if not t.get("holder"):
            h = holders.get(_group_key(t))
            if h:
                t["holder"] = h
