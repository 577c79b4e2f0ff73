"""Child memory cgroups for tests that need a real kernel OOM kill.

A :class:`ChildCgroup` is created **under this process's own memory cgroup** (never at the root
of a hierarchy), given a memory limit, and removed afterwards: remaining tasks are SIGKILLed and
the directory removed. Swap cannot hide the OOM: on v1 ``memory.memsw.limit_in_bytes`` is set to
the same limit when swap accounting exists (else ``memory.swappiness`` 0 if swap is on), on v2
``memory.swap.max`` is set to 0.

Processes join the cgroup themselves before they exec (``/bin/sh`` writes its pid to
``cgroup.procs``, then execs the command), so nothing they allocate is charged elsewhere.

Where no writable memory cgroup exists (not root, no memory controller, a v2 cgroup that holds
processes and so cannot enable the controller for children), :class:`NoWritableCgroup` says why;
:func:`child_cgroup_or_skip` turns that into ``pytest.skip``.

Also used outside pytest by ``docs/experiments/*.py`` (imported by path).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from memwatch.probes.cgroup import CgroupLocation, Unavailable, locate

MIB = 1 << 20


class NoWritableCgroup(Exception):
    """No memory cgroup can be created here; ``str(e)`` is the reason."""


def swap_active() -> bool:
    """True when ``/proc/swaps`` lists a swap device or file."""
    try:
        with open("/proc/swaps") as f:
            return len(f.read().strip().splitlines()) > 1
    except OSError:
        return False


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _field(text: str, key: str) -> int | None:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return None


class ChildCgroup:
    """A memory-limited cgroup nested under this process's own memory cgroup.

    Use as a context manager (``with ChildCgroup(200 * MIB) as cg:``) or call :meth:`create` and
    :meth:`remove`. ``parent`` overrides where it is created (a :class:`CgroupLocation`, by default
    this process's).
    """

    def __init__(
        self, limit_bytes: int, *, name: str | None = None, parent: CgroupLocation | None = None
    ) -> None:
        self.limit = int(limit_bytes)
        self.name = name or f"memwatch-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._parent = parent
        self.parent: CgroupLocation | None = None
        self.path = ""
        self.version = 0
        self.swap_guard = ""  # how swap was kept from hiding the OOM
        self._popens: list[subprocess.Popen[Any]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def create(self) -> ChildCgroup:
        loc = self._parent or locate()
        if isinstance(loc, Unavailable):
            raise NoWritableCgroup(f"no memory cgroup: {loc.reason}")
        if os.path.normpath(loc.path) == os.path.normpath(loc.mount):
            raise NoWritableCgroup(
                f"this process's memory cgroup is the top of the mounted hierarchy ({loc.path}); "
                "test cgroups are only created nested under it, never at a hierarchy root"
            )
        self.parent, self.version = loc, loc.version
        if loc.version == 2:
            self._enable_v2_controller(loc.path)
        path = os.path.join(loc.path, self.name)
        try:
            os.mkdir(path)
        except OSError as e:
            raise NoWritableCgroup(f"cannot create {path}: {e.strerror}") from e
        self.path = path
        try:
            self._set_limits()
        except OSError as e:
            self.remove()
            raise NoWritableCgroup(f"cannot set the memory limit of {path}: {e.strerror}") from e
        return self

    def _enable_v2_controller(self, parent: str) -> None:
        control = os.path.join(parent, "cgroup.subtree_control")
        try:
            if "memory" in _read(control).split():
                return
            _write(control, "+memory")
        except OSError as e:
            raise NoWritableCgroup(
                f"cannot enable the memory controller for children of {parent} ({e.strerror}): "
                "on cgroup v2 a cgroup that holds processes cannot distribute memory to children "
                "(no-internal-process rule); run the tests in a delegated cgroup whose processes "
                "sit in a leaf (e.g. systemd-run --user -p Delegate=yes --scope)"
            ) from e

    def _set_limits(self) -> None:
        if self.version == 1:
            _write(self._f("memory.limit_in_bytes"), str(self.limit))
            if os.path.exists(self._f("memory.memsw.limit_in_bytes")):
                # memory+swap limited to the same figure: swap cannot absorb the excess. Set after
                # memory.limit_in_bytes (memsw must never be below it).
                _write(self._f("memory.memsw.limit_in_bytes"), str(self.limit))
                self.swap_guard = "memory.memsw.limit_in_bytes = limit"
            elif swap_active():
                _write(self._f("memory.swappiness"), "0")
                self.swap_guard = "memory.swappiness = 0 (no swap accounting)"
            else:
                self.swap_guard = "no swap active"
        else:
            _write(self._f("memory.max"), str(self.limit))
            if os.path.exists(self._f("memory.swap.max")):
                _write(self._f("memory.swap.max"), "0")
                self.swap_guard = "memory.swap.max = 0"
            else:
                self.swap_guard = "no swap controller" + ("" if swap_active() else ", no swap")

    def remove(self, timeout: float = 10.0) -> None:
        """SIGKILL every task left in the cgroup, reap ours, and remove the directory."""
        if not self.path:
            return
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            for proc in self._popens:
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.05)
            if not pids:
                try:
                    os.rmdir(self.path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    pass  # EBUSY: a task still exiting
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not remove {self.path}: tasks {self.pids()}")
            time.sleep(0.02)
        self.path = ""

    def __enter__(self) -> ChildCgroup:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- files -------------------------------------------------------------------------------

    def _f(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read(self, name: str) -> str:
        return _read(self._f(name))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self.read("cgroup.procs").split()]
        except OSError:
            return []

    @property
    def location(self) -> CgroupLocation:
        """This cgroup as a :class:`CgroupLocation` (for ``CgroupProbe(location=...)``)."""
        assert self.parent is not None
        rel = os.path.relpath(self.path, self.parent.mount)
        return CgroupLocation(self.version, self.path, self.parent.mount, "/" + rel)

    def oom_kills(self, local: bool = False) -> int:
        """The cgroup's ``oom_kill`` counter (v2: ``memory.events``, ``.local`` if asked)."""
        if self.version == 1:
            name = "memory.oom_control"
        else:
            name = "memory.events.local" if local else "memory.events"
        return _field(self.read(name), "oom_kill") or 0

    @staticmethod
    def parent_oom_kills(loc: CgroupLocation) -> int:
        name = "memory.oom_control" if loc.version == 1 else "memory.events"
        return _field(_read(os.path.join(loc.path, name)), "oom_kill") or 0

    # -- processes ---------------------------------------------------------------------------

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the cgroup: it joins before exec, so all it allocates counts."""
        trampoline = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self._f("cgroup.procs")]
        proc = subprocess.Popen([*trampoline, *argv], **kwargs)
        self._popens.append(proc)
        return proc

    def run_python(
        self, code: str, *, timeout: float = 120, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -c code`` in the cgroup; kills it (and raises) past ``timeout``."""
        proc = self.popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def create_child_cgroup(limit_bytes: int, **kwargs: Any) -> ChildCgroup:
    """A created :class:`ChildCgroup`, or ``pytest.skip`` with the reason none can be."""
    import pytest

    try:
        return ChildCgroup(limit_bytes, **kwargs).create()
    except NoWritableCgroup as e:
        pytest.skip(f"no writable memory cgroup: {e}")


@contextlib.contextmanager
def child_cgroup_or_skip(limit_bytes: int, **kwargs: Any) -> Iterator[ChildCgroup]:
    """``with child_cgroup_or_skip(200 * MIB) as cg:`` -- skips the test where none can be made."""
    cg = create_child_cgroup(limit_bytes, **kwargs)
    try:
        yield cg
    finally:
        cg.remove()


class KernelLog:
    """New ``/dev/kmsg`` records since construction (the OOM killer's report), if readable."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self._fd = None

    @property
    def readable(self) -> bool:
        return self._fd is not None

    def read(self) -> list[tuple[float, str]]:
        """``(seconds since boot, message)`` records logged since the last read."""
        out: list[tuple[float, str]] = []
        if self._fd is None:
            return out
        while True:
            try:
                rec = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records overwritten; go on with the next
                continue
            head, _, msg = rec.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            ts = int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else float("nan")
            out.append((ts, msg.split("\n", 1)[0]))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
