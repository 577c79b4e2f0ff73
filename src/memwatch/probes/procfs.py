"""Small, allocation-light readers of Linux ``/proc`` and cgroup files."""

from __future__ import annotations

import dataclasses
import os

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_from_statm_fd(fd: int) -> int:
    """Resident bytes from an open ``statm`` descriptor (second field, in pages)."""
    data = os.pread(fd, 128, 0)
    return int(data.split(None, 2)[1]) * PAGE_SIZE


def rss_of_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read(128).split(None, 2)[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def rss_now() -> int | None:
    """This process's resident bytes now (``/proc/self/statm``), None where unreadable."""
    return rss_of_pid(os.getpid())


def address_space() -> dict[str, int | None]:
    """VmSize and RLIMIT_AS: a run that dies of an address-space limit was "full" by this."""
    out: dict[str, int | None] = {"vmsize": None, "rlimit_as": None}
    try:
        with open("/proc/self/statm", "rb") as f:
            out["vmsize"] = int(f.read(128).split()[0]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        out["rlimit_as"] = None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, OSError, ValueError):
        pass
    return out


@dataclasses.dataclass(frozen=True)
class Rollup:
    rss: float
    pss: float
    uss: float
    swap: float


def read_smaps_rollup(pid: int) -> Rollup | None:
    """RSS, PSS, USS (private clean + private dirty) and swap of ``pid``, in bytes.

    USS is what the process alone holds; PSS splits shared pages between their sharers. Summing RSS
    over forked DataLoader workers double-counts copy-on-write pages; summing PSS does not.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return None
    vals: dict[bytes, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(b":"):
            try:
                vals[parts[0][:-1]] = int(parts[1]) * 1024
            except ValueError:
                continue
    if b"Rss" not in vals:
        return None
    uss = vals.get(b"Private_Clean", 0) + vals.get(b"Private_Dirty", 0)
    return Rollup(
        rss=float(vals[b"Rss"]),
        pss=float(vals.get(b"Pss", 0)),
        uss=float(uss),
        swap=float(vals.get(b"Swap", 0)),
    )


def read_comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def children_of(pid: int) -> list[int]:
    """Direct children via ``/proc/<pid>/task/*/children`` (cheap, no full process scan)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _read_int_file(path: str) -> int | None:
    try:
        with open(path) as f:
            raw = f.read().strip()
    except OSError:
        return None
    if raw in ("", "max"):
        return None
    try:
        v = int(raw)
    except ValueError:
        return None
    # cgroup v1 reports "no limit" as a huge page-aligned number.
    return v if 0 < v < (1 << 60) else None


def cgroup_memory_limit() -> int | None:
    """This process's cgroup memory limit in bytes (v2 ``memory.max`` or v1), if any."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2 unified hierarchy
            v = _read_int_file(f"/sys/fs/cgroup{path}/memory.max")
            if v is None:
                v = _read_int_file("/sys/fs/cgroup/memory.max")
            if v is not None:
                return v
        elif "memory" in controllers.split(","):
            for base in (f"/sys/fs/cgroup/memory{path}", "/sys/fs/cgroup/memory"):
                v = _read_int_file(f"{base}/memory.limit_in_bytes")
                if v is not None:
                    return v
    return None


def host_memory_limit() -> int | None:
    """The tighter of the cgroup limit and physical memory."""
    limits = []
    cg = cgroup_memory_limit()
    if cg is not None:
        limits.append(cg)
    try:
        import psutil

        limits.append(int(psutil.virtual_memory().total))
    except Exception:  # noqa: BLE001 - psutil is a dependency, but never fail on a limit
        pass
    return min(limits) if limits else None
