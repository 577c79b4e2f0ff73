"""The documents of a bundle: what each JSON file says, built from the captured evidence.

:class:`Capture` is the evidence gathered at a failure (by :func:`memwatch.runtime.capture.capture`,
before the stack unwinds where the device allows); the functions here turn it and the run's
static facts into the bundle's documents, redacted (``timeline.jsonl``, ``environment.json``,
``exception.json``, ``ranks.json``, the allocator's segment summary).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from memwatch._version import __version__
from memwatch.bundle.format import host_name
from memwatch.core.oom import Classification
from memwatch.core.redact import redact_argv, redact_env, redact_obj, redact_truncate
from memwatch.core.untrusted import MAX_INT

__all__ = ["ENV_PREFIXES", "Capture", "environment", "environment_static", "exception_doc",
           "qualname", "ranks_doc", "segments_summary", "timeline_records"]

_MAX_MESSAGE = 16 * 1024
_MAX_TRACEBACK = 256 * 1024
# Environment variables worth keeping in a bundle (values redacted when their names look secret).
ENV_PREFIXES = (
    "PYTORCH_", "TORCH_", "CUDA_", "NCCL_", "NVIDIA_", "CUBLAS_", "CUDNN_", "OMP_", "MKL_",
    "SLURM_", "HF_", "HUGGING", "TRANSFORMERS_", "WANDB_", "ACCELERATE_", "MASTER_", "LOCAL_",
    "RANK", "WORLD_", "GROUP_", "ROLE_", "TORCHELASTIC_", "PL_", "LIGHTNING_", "XLA_", "MALLOC_",
    "LD_PRELOAD", "MEMWATCH_", "SLURMD_",
)


@dataclasses.dataclass
class Capture:
    """Evidence gathered at one moment (before the unwind when it comes from the observer)."""

    wall: float
    mono: float
    pre_unwind: bool
    thread: str
    observer: dict[str, int] | None = None
    latest: dict[str, float] = dataclasses.field(default_factory=dict)
    limits: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_stats: dict[str, Any] | None = None
    snapshot: Any = None
    census: dict[str, Any] | None = None
    keys: tuple[str, ...] = ()
    rows: Any = None  # (n, M) float array copy
    steps: Any = None
    times: Any = None
    epochs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    claimed: bool = False
    #: ``time.monotonic()`` when the capture was complete (its parts take time: the census, the
    #: killer's walks); how old a pending capture is counts from here.
    done: float = 0.0


def qualname(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _size(v: Any) -> int:
    """A size field of a snapshot (it may come from anyone): an integer of 0..2**64, else 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT else 0


def segments_summary(snapshot: Any) -> dict[str, Any] | None:
    """Segments, reserved/allocated bytes, largest free and allocated blocks of a snapshot
    (sizes that are not byte counts count as 0)."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        return None
    reserved = allocated = largest_free = 0
    blocks_alloc: list[int] = []
    n_blocks = 0
    for seg in snapshot["segments"]:
        if not isinstance(seg, dict):
            continue
        reserved += _size(seg.get("total_size"))
        allocated += _size(seg.get("allocated_size"))
        blocks = seg.get("blocks")
        for b in blocks if isinstance(blocks, (list, tuple)) else ():
            if not isinstance(b, dict):
                continue
            n_blocks += 1
            size = _size(b.get("size"))
            if str(b.get("state", "")).startswith("active"):
                blocks_alloc.append(size)
            else:
                largest_free = max(largest_free, size)
    blocks_alloc.sort(reverse=True)
    return {
        "segments": len(snapshot["segments"]),
        "blocks": n_blocks,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "free_in_segments_bytes": reserved - allocated,
        "largest_free_block_bytes": largest_free,
        "largest_allocated_blocks_bytes": blocks_alloc[:10],
    }


def timeline_records(cap: Capture) -> Iterator[dict[str, Any]]:
    """``timeline.jsonl`` records: a header, one per raw sample, one per epoch summary."""
    offset = cap.wall - cap.mono  # timeline times are monotonic: convert to wall clock
    n = 0 if cap.rows is None else len(cap.rows)
    yield {"type": "header", "keys": list(cap.keys), "samples": n, "wall_offset": offset}
    for i in range(n):
        rec: dict[str, Any] = {"type": "sample", "step": int(cap.steps[i]),
                               "t": round(float(cap.times[i]) + offset, 4)}
        row = cap.rows[i]
        for j, k in enumerate(cap.keys):
            rec[k] = float(row[j])
        yield rec
    for e in cap.epochs:
        yield {"type": "epoch", **e}


def environment_static(device: Any = None) -> dict[str, Any]:
    """The parts of ``environment.json`` that do not change during a run (taken at start)."""
    u = os.uname() if hasattr(os, "uname") else None
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_build": sys.version,
        "executable": sys.executable,
        "platform": f"{u.sysname} {u.release} {u.machine}" if u else platform.system(),
        "host": host_name(),
        "memwatch": __version__,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = str(getattr(torch, "__version__", "?"))
        ver = getattr(torch, "version", None)
        env["torch_cuda"] = getattr(ver, "cuda", None)
        env["torch_hip"] = getattr(ver, "hip", None)
        try:
            if torch.cuda.is_available():
                env["cuda_device_count"] = torch.cuda.device_count()
                cudnn = getattr(torch.backends, "cudnn", None)
                env["cudnn"] = cudnn.version() if cudnn is not None else None
        except Exception:  # noqa: BLE001
            pass
    nvml = sys.modules.get("pynvml")
    if nvml is not None:
        try:
            drv = nvml.nvmlSystemGetDriverVersion()
            env["nvidia_driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:  # noqa: BLE001
            pass
    if device is not None:
        try:
            env["device"] = device.describe()
        except Exception as e:  # noqa: BLE001
            env["device"] = {"error": str(e)}
    return env


def environment(static: Mapping[str, Any], rank: Mapping[str, int],
                history_on: bool) -> dict[str, Any]:
    """``environment.json``: static facts plus argv, rank and relevant variables, redacted."""
    env = dict(static)
    env["pid"] = os.getpid()
    env["cwd"] = os.getcwd()
    env["argv"] = redact_argv(sys.argv)
    env["rank"] = dict(rank)
    env["env"] = redact_env({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)})
    env["history_recording"] = history_on
    return redact_obj(env)  # type: ignore[no-any-return]


def ranks_doc(summaries: Sequence[Any], job: Mapping[str, Any], missing: Sequence[int],
              exchange_error: str | None) -> dict[str, Any] | None:
    """``ranks.json`` (rank 0 of a distributed run): every rank's latest epoch-end summary (each
    says its epoch and time), and the ranks that missed an exchange. It shows what the other ranks
    looked like even when they leave no bundle of their own. None when there is nothing to
    record."""
    summaries = list(summaries or [])
    if not summaries:
        return None
    return {
        "world_size": len(summaries),
        "job": dict(job or {}),
        "epoch": max((s.get("epoch") or 0 for s in summaries if isinstance(s, dict)), default=None),
        "missing": sorted(set(missing or []) | {i for i, s in enumerate(summaries) if s is None}),
        "exchange_error": exchange_error,
        "summaries": summaries,
    }


def exception_doc(exc: BaseException, cls: Classification | None) -> dict[str, Any]:
    """``exception.json``: type, redacted message and traceback, parsed OOM figures."""
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = "<unprintable message>"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # Redacted before they are cut: a cut could keep a key's body without its BEGIN line.
    return {
        "type": qualname(type(exc)),
        "message": redact_truncate(msg, _MAX_MESSAGE),
        "classification": cls.kind if cls else None,
        "matched": cls.to_dict() if cls else None,
        "numbers": dict(cls.numbers) if cls else {},
        "notes": [redact_truncate(str(n), _MAX_MESSAGE)
                  for n in list(getattr(exc, "__notes__", None) or [])[:20]],
        "traceback": redact_truncate(tb, _MAX_TRACEBACK, keep="tail"),
    }
