"""Small, allocation-light readers of Linux ``/proc`` and cgroup files."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

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


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22): a pid
    reused by another process has another start time. None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read(4096)  # (one line of a few hundred bytes)
        return int(raw[raw.rindex(b")") + 2:].split()[19])
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
    #: Anonymous resident pages (``Anonymous:``; None on kernels without it): counted by the
    #: page-table walk itself, so exact at the moment of the read.
    anon: float | None = None


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
        anon=float(vals[b"Anonymous"]) if b"Anonymous" in vals else None,
    )


@dataclasses.dataclass(frozen=True)
class RssSplit:
    """Resident memory by kind, in bytes (``/proc/<pid>/status``, Linux 4.5+).

    ``anon``: private anonymous pages (the heap, anonymous maps, copied-on-write pages of
    private file maps): what only swap could free. ``file``: pages of mapped files (memory-mapped
    datasets and weights, shared libraries): page cache the kernel drops (clean) or writes back
    (dirty) under pressure. ``shmem``: shared memory (``/dev/shm``, memfd, tensors a DataLoader
    worker passed through shared memory): not reclaimable without swap. The three add up to RSS.
    """

    anon: float
    file: float
    shmem: float


def parse_rss_split(text: bytes) -> RssSplit | None:
    r"""The ``RssAnon``/``RssFile``/``RssShmem`` lines of a ``status`` file (values in kB).

    Example::

        >>> parse_rss_split(b"VmRSS:\t  300 kB\nRssAnon:\t  200 kB\nRssFile:\t   96 kB\n"
        ...                 b"RssShmem:\t    4 kB\n")
        RssSplit(anon=204800.0, file=98304.0, shmem=4096.0)
        >>> parse_rss_split(b"VmRSS:\t  300 kB\n") is None  # a kernel before 4.5
        True
    """
    vals: dict[bytes, float] = {}
    for line in text.splitlines():
        if not line.startswith(b"Rss"):
            continue
        name, _, rest = line.partition(b":")
        parts = rest.split()
        if parts:
            try:
                vals[name] = float(int(parts[0]) * 1024)
            except ValueError:
                continue
    if b"RssAnon" not in vals or b"RssFile" not in vals:
        return None
    return RssSplit(anon=vals[b"RssAnon"], file=vals[b"RssFile"],
                    shmem=vals.get(b"RssShmem", 0.0))


def read_rss_split(pid: int) -> RssSplit | None:
    """:func:`parse_rss_split` of ``/proc/<pid>/status`` (about 10 us: background reads only).

    The kernel's per-process counters behind these lines are updated lazily (per-CPU or
    per-thread deltas folded later), so a read can miss a recent fault: a 64 MiB array written a
    moment before once did not show at all. :func:`exact_rss_split` corrects it from a
    ``smaps_rollup`` read where one was taken anyway."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return parse_rss_split(f.read())
    except OSError:
        return None


def exact_rss_split(rollup: Rollup, split: RssSplit | None) -> RssSplit | None:
    """The RSS split with the anonymous part and the total from ``smaps_rollup`` (a page-table
    walk: exact when read) and shared memory from ``status`` (which ``smaps_rollup`` does not
    give): file-backed is what is left. ``split`` unchanged where the rollup lacks
    ``Anonymous``.

    Example::

        >>> r = Rollup(rss=100.0, pss=90.0, uss=80.0, swap=0.0, anon=70.0)
        >>> exact_rss_split(r, RssSplit(anon=6.0, file=30.0, shmem=4.0))
        RssSplit(anon=70.0, file=26.0, shmem=4.0)
    """
    if rollup.anon is None:
        return split
    shmem = min(split.shmem if split is not None else 0.0, max(rollup.rss - rollup.anon, 0.0))
    return RssSplit(anon=rollup.anon, file=max(rollup.rss - rollup.anon - shmem, 0.0),
                    shmem=shmem)


#: Mappings that are shared memory, not files the page cache can drop.
_SHMEM_PREFIXES = (b"/dev/shm/", b"/memfd:", b"/SYSV", b"/dev/zero")


def parse_mapped_files(lines: Iterable[bytes], top: int = 5) -> list[tuple[str, float]]:
    r"""The data files whose mapped pages are most resident, from the lines of a ``smaps`` file:
    (path, bytes), largest first. Counts ``Rss`` less ``Anonymous`` (copied-on-write pages of a
    private map are anonymous memory, not the file's). Left out: anonymous maps, shared memory,
    and files mapped executable anywhere (shared libraries and the interpreter: code, not data).

    Example::

        >>> text = (b"7f00-7f10 r--s 00000000 fe:00 12 /data/train.bin\nRss:  8192 kB\n"
        ...         b"Anonymous:  0 kB\n7f10-7f20 rw-p 00000000 00:00 0 \nRss:  64 kB\n"
        ...         b"7f20-7f30 r--s 00000000 fe:00 12 /data/train.bin\nRss:  1024 kB\n"
        ...         b"7f30-7f40 r-xp 00000000 fe:00 13 /usr/lib/libc.so.6\nRss:  2048 kB\n")
        >>> parse_mapped_files(text.splitlines())
        [('/data/train.bin', 9437184.0)]
    """
    sizes: dict[bytes, float] = {}
    code: set[bytes] = set()
    path: bytes | None = None
    for line in lines:
        head = line.split(None, 1)
        if not head:
            continue
        if not head[0].endswith(b":"):  # a mapping's header: range perms offset dev inode path
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else None
            if path is not None and (not path.startswith(b"/")
                                     or path.startswith(_SHMEM_PREFIXES)):
                path = None
            if path is not None and b"x" in parts[1]:
                code.add(path)
            continue
        if path is None or head[0] not in (b"Rss:", b"Anonymous:"):
            continue
        try:
            kb = float(int(head[1].split()[0]) * 1024)
        except (ValueError, IndexError):
            continue
        sizes[path] = sizes.get(path, 0.0) + (kb if head[0] == b"Rss:" else -kb)
    ranked = sorted(((p.decode("utf-8", "replace"), b) for p, b in sizes.items()
                     if b > 0 and p not in code),
                    key=lambda pb: pb[1], reverse=True)
    return ranked[:top]


def read_mapped_files(pid: int, top: int = 5) -> list[tuple[str, float]]:
    """:func:`parse_mapped_files` of ``/proc/<pid>/smaps`` ([] where unreadable). Its cost grows
    with the number of mappings (milliseconds for a torch process): check time only. Read line by
    line, so that a big process's ``smaps`` never sits in memory whole."""
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            return parse_mapped_files(f, top)
    except OSError:
        return []


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


def parse_vm(text: bytes) -> dict[str, float]:
    r"""``VmSize`` and ``VmData`` of a ``status`` file, in bytes.

    Example::

        >>> parse_vm(b"VmPeak:\t 900 kB\nVmSize:\t  800 kB\nVmData:\t  300 kB\n")
        {'VmSize': 819200.0, 'VmData': 307200.0}
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((b"VmSize:", b"VmData:")):
            name, _, rest = line.partition(b":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name.decode()] = float(int(parts[0]) * 1024)
    return out


#: The process limits that end a run of their own (``setrlimit``), the status line each is
#: measured against, and how messages name them (with the value set: ``ulimit`` takes KiB).
RLIMITS = (
    ("RLIMIT_AS", "VmSize", "the address-space limit (RLIMIT_AS {gib}, `ulimit -v {kib}`)"),
    ("RLIMIT_DATA", "VmData", "the data-segment limit (RLIMIT_DATA {gib}, `ulimit -d {kib}`)"),
)


def rlimit_name(template: str, soft: int) -> str:
    """A limit's name quoting the value set: ``ulimit -v 3000000`` is 3,000,000 KiB, 2.86 GiB.

    Example::

        >>> rlimit_name(RLIMITS[0][2], 3_000_000 * 1024)
        'the address-space limit (RLIMIT_AS 2.86 GiB, `ulimit -v 3000000`)'
    """
    return template.format(gib=f"{soft / 2**30:.2f} GiB", kib=soft // 1024)


def rlimit_room(pid: int | None = None) -> tuple[float, str] | None:
    """The room the tightest of this process's address-space and data-segment limits leaves
    (limit less what the process uses by that limit's measure), and its name; None when neither
    is set. Memory that grows takes address space with it, so a growing RSS dies when this room
    is gone, whatever the machine has left."""
    import resource

    want: list[tuple[int, str, str]] = []
    for attr, field, name in RLIMITS:
        lim = getattr(resource, attr, None)
        if lim is None:
            continue
        try:
            soft, _ = resource.getrlimit(lim)
        except (OSError, ValueError):
            continue
        if soft != resource.RLIM_INFINITY and soft > 0:
            want.append((int(soft), field, rlimit_name(name, int(soft))))
    if not want:
        return None
    try:
        with open(f"/proc/{pid or 'self'}/status", "rb") as f:
            vm = parse_vm(f.read())
    except OSError:
        return None
    rooms = [(max(soft - vm[field], 0.0), name) for soft, field, name in want if field in vm]
    return min(rooms) if rooms else None


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
