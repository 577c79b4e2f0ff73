"""A real second local user for the shared-machine tests: the attacker (or the colleague).

:func:`other_user` (a session fixture, in ``tests/conftest.py``) creates a user with ``useradd``
when the tests run as root and removes it at the end; elsewhere it skips, saying why. The
attacker's steps run in a forked child that drops to that user (``os.setgroups``, ``os.setgid``,
``os.setuid``) and returns a small JSON result through a pipe: the same Python image, so the
user needs no access to the interpreter's files.

Example (inside a test)::

    res = as_user(other_user, lambda: os.listdir(victim_dir))   # {"ok": False, "error": ...}
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import traceback
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def create_user(name: str) -> User | str:
    """Create ``name`` (no home, no login): the user, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "needs root to create a second user (useradd)"
    if shutil.which("useradd") is None:
        return "useradd is not installed"
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "--user-group", name], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            return f"useradd failed: {r.stderr.strip()}"
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid)


def delete_user(user: User) -> None:
    subprocess.run(["userdel", user.name], capture_output=True, timeout=60)


def as_user(user: User, fn: Callable[[], Any], groups: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run ``fn`` as ``user`` in a forked child: ``{"ok": True, "value": ...}`` or
    ``{"ok": False, "error": "PermissionError: ..."}``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker
        os.close(r)
        try:
            os.setgroups(list(groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            out: dict[str, Any] = {"ok": True, "value": fn()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"ok": False, "error": f"{type(e).__name__}: {e}",
                   "where": traceback.format_exc(limit=3)}
        try:
            os.write(w, json.dumps(out, default=str).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"ok": false, "error": "child died"}')
