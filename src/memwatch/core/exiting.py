"""What is still open when the interpreter exits is closed cleanly, newest first.

A script that attaches memwatch and never detaches it (the Accelerate docs' one-line
``attach(accelerator, optimizer)``, a ``MemWatch`` started without ``with``) ends, as far as the
user is concerned, cleanly: its sessions must close as ``close()`` would (the last check, the
report, ``summary.json``, the black box removed) instead of leaving a record that says the run
"ended without a clean close". SIGKILL and the kernel's OOM killer skip every exit handler: their
record stays, as it should.

The handler is registered again each time an object is added, so it runs before the exit
handlers registered earlier (``atexit`` runs the newest first): wandb's, registered at
``wandb.init()``, still finds its run open when memwatch's sinks write their last words.

Example::

    >>> from memwatch.core.exiting import ExitRegistry
    >>> closed = []
    >>> class Session:
    ...     def close(self) -> None:
    ...         closed.append(self)
    >>> registry = ExitRegistry()
    >>> a, b = Session(), Session()
    >>> registry.add(a); registry.add(b)
    >>> registry.close_all()  # what the exit handler does
    >>> closed == [b, a]
    True
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

__all__ = ["ExitRegistry", "at_exit"]

log = logging.getLogger("memwatch")


class ExitRegistry:
    """Objects (weakly held) whose ``close()`` runs at interpreter exit, the newest first."""

    def __init__(self) -> None:
        self._objects: list[weakref.ref[Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: The exception the interpreter exits with, while :meth:`close_all` runs.
        self.exiting_with: BaseException | None = None

    def add(self, obj: Any) -> None:
        """Close ``obj`` at exit unless it is gone (or :meth:`discard`-ed) by then."""
        with self._lock:
            self._objects = [r for r in self._objects if r() is not None and r() is not obj]
            self._objects.append(weakref.ref(obj))
        atexit.unregister(self.close_all)  # to the end of atexit's list: it runs first
        atexit.register(self.close_all)

    def discard(self, obj: Any) -> None:
        with self._lock:
            self._objects = [r for r in self._objects if r() is not None and r() is not obj]

    def close_all(self) -> None:
        """Close every live object, newest first; never raises."""
        if os.getpid() != self._pid:
            return  # a forked child closes nothing of its parent's
        import sys

        self.exiting_with = getattr(sys, "last_value", None)
        with self._lock:
            objects, self._objects = [r() for r in reversed(self._objects)], []
        for obj in objects:
            if obj is None:
                continue
            try:
                obj.close()
            except Exception as e:  # noqa: BLE001 - the exit goes on
                log.warning("memwatch: closing %s at exit failed (%s: %s)",
                            type(obj).__name__, type(e).__name__, e)


#: The registry of this process: sessions add themselves when they start, adapters too.
at_exit = ExitRegistry()
