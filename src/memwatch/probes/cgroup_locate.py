"""Where this process's memory cgroup is: ``/proc/self/mountinfo`` and ``/proc/self/cgroup``
parsed for cgroup v1 and v2 (split from :mod:`memwatch.probes.cgroup`, which reads it)."""

from __future__ import annotations

import dataclasses
import os

__all__ = ["CgroupLocation", "Unavailable", "locate", "parse_mountinfo", "parse_proc_cgroup"]


@dataclasses.dataclass(frozen=True)
class CgroupLocation:
    """Where a process's memory cgroup lives.

    ``path`` is the cgroup's directory; ``mount`` the mount point of its hierarchy (the parent
    walk for the effective limit stops there: what lies above a container's mount is not
    visible); ``cgroup`` the path as ``/proc/<pid>/cgroup`` names it.
    """

    version: int
    path: str
    mount: str
    cgroup: str


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """No memory cgroup can be read, and why."""

    reason: str


@dataclasses.dataclass(frozen=True)
class _Mount:
    root: str
    mountpoint: str
    fstype: str
    superopts: tuple[str, ...]


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup and cgroup2 mounts in ``/proc/<pid>/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        if sep < 5 or len(fields) < sep + 4:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(
                root=_unescape(fields[3]),
                mountpoint=_unescape(fields[4]),
                fstype=fstype,
                superopts=tuple(fields[sep + 3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """``(v1 memory path, v2 unified path)`` from ``/proc/<pid>/cgroup`` text; None if absent."""
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def _join(mount: _Mount, path: str) -> str | None:
    """The directory of cgroup ``path`` under ``mount``, or None if outside what it shows."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    rel = path[len(root) :].strip("/")
    return os.path.join(mount.mountpoint, rel) if rel else mount.mountpoint


def locate(
    pid: int | str = "self",
    *,
    proc: str = "/proc",
    sys_cgroup: str = "/sys/fs/cgroup",
) -> CgroupLocation | Unavailable:
    """Find the memory cgroup of ``pid``: v1 when the memory controller is bound to a v1
    hierarchy (also in hybrid setups, where a ``0::`` line names the controller-less unified
    tree), else v2. ``proc`` and ``sys_cgroup`` let tests point at a fake tree.
    """
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            v1_path, v2_path = parse_proc_cgroup(f.read())
    except OSError as e:
        return Unavailable(
            f"cannot read {proc}/{pid}/cgroup ({e.strerror}): not Linux, or no /proc"
        )
    try:
        with open(f"{proc}/{pid}/mountinfo") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        mounts = []
    if not mounts:  # no mountinfo: the conventional places
        mounts = [
            _Mount("/", f"{sys_cgroup}/memory", "cgroup", ("rw", "memory")),
            _Mount("/", f"{sys_cgroup}/unified", "cgroup2", ("rw",)),
            _Mount("/", sys_cgroup, "cgroup2", ("rw",)),
        ]
    if v1_path is not None:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.superopts:
                d = _join(m, v1_path)
                if d is not None and os.path.exists(os.path.join(d, "memory.usage_in_bytes")):
                    return CgroupLocation(1, d, m.mountpoint, v1_path)
    if v2_path is not None:
        reasons = []
        for m in mounts:
            if m.fstype != "cgroup2":
                continue
            d = _join(m, v2_path)
            if d is None:
                reasons.append(
                    f"cgroup {v2_path} is outside the mounted part of the v2 hierarchy "
                    f"(root {m.root} at {m.mountpoint})"
                )
            elif os.path.exists(os.path.join(d, "memory.current")):
                return CgroupLocation(2, d, m.mountpoint, v2_path)
            elif not _has_memory(m.mountpoint):
                # A hybrid setup's controller-less unified tree, or a fallback guess.
                reasons.append(f"the cgroup2 tree at {m.mountpoint} has no memory controller")
            elif d == m.mountpoint and m.root == "/":
                return Unavailable(
                    f"{d} is the root cgroup (v2): it has no memory.current or memory.max, "
                    "no cgroup limit applies"
                )
            else:
                return Unavailable(
                    f"the memory controller is not enabled for {d} (cgroup v2: no "
                    "memory.current; its parent's cgroup.subtree_control lacks 'memory')"
                )
        if reasons:
            return Unavailable("; ".join(dict.fromkeys(reasons)))
    if v1_path is None and v2_path is None:
        return Unavailable(f"{proc}/{pid}/cgroup names no memory cgroup")
    return Unavailable("no mounted cgroup hierarchy with the memory controller was found")


def _has_memory(mountpoint: str) -> bool:
    try:
        with open(os.path.join(mountpoint, "cgroup.controllers")) as f:
            return "memory" in f.read().split()
    except OSError:
        return False
