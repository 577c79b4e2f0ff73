"""The process-wide hooks the flight recorder listens through: ``sys.excepthook``,
``threading.excepthook``, and the SIGTERM/SIGUSR1 handlers.

Each is chained: the previous hook or handler runs after memwatch's, and :meth:`FailureHooks.
uninstall` restores only what is still memwatch's (if something chained on top, it is left in
place and memwatch's hook just forwards).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["FailureHooks"]

log = logging.getLogger("memwatch")


class FailureHooks:
    """Calls ``on_exception(exc)`` for uncaught exceptions (main and other threads) and
    ``on_signal(name)`` for SIGTERM/SIGUSR1, then hands each on; a signal whose ``on_signal``
    returns False waits for :meth:`release_deferred`."""

    def __init__(self, on_exception: Callable[[BaseException], Any],
                 on_signal: Callable[[str], Any], signals: bool = True) -> None:
        self._on_exception = on_exception
        self._on_signal_cb = on_signal
        self._signals = signals
        self._pid = os.getpid()
        self.active = False
        self._prev_excepthook: Any = None
        self._prev_thread_hook: Any = None
        self._prev_signals: dict[int, Any] = {}
        self._deferred: list[int] = []

    def install(self) -> None:
        self.active = True
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        if not self._signals or threading.current_thread() is not threading.main_thread():
            return
        for name in ("SIGTERM", "SIGUSR1"):
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                self._prev_signals[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)
            except (ValueError, OSError) as e:
                self._prev_signals.pop(signum, None)
                log.warning("memwatch: %s handler not installed (%s)", name, e)

    def uninstall(self) -> None:
        # Restore only what is still ours: if something chained on top of us, leave it (our hook
        # then just forwards, because we are no longer active).
        self.active = False
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._prev_thread_hook
        if threading.current_thread() is threading.main_thread():
            for signum, prev in list(self._prev_signals.items()):
                try:
                    if signal.getsignal(signum) == self._on_signal:
                        signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
                        del self._prev_signals[signum]
                except (ValueError, OSError):
                    pass

    def _excepthook(self, tp: type[BaseException], value: BaseException, tb: Any) -> None:
        if self.active and value is not None:
            self._on_exception(value)
        prev = self._prev_excepthook or sys.__excepthook__
        prev(tp, value, tb)

    def _thread_excepthook(self, args: Any) -> None:
        if self.active and args.exc_value is not None:
            self._on_exception(args.exc_value)
        prev = self._prev_thread_hook or threading.__excepthook__
        prev(args)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.active and os.getpid() == self._pid:
            if self._on_signal_cb(signal.Signals(signum).name) is False:
                # A bundle is being written (the launcher's SIGTERM right after this rank's
                # collective failed): handed on once it is committed (release_deferred).
                self._deferred.append(signum)
                return
        self._hand_on(signum, frame)

    def release_deferred(self) -> None:
        """Hand on the signals that came while a bundle was being written (the default action
        of SIGTERM, termination, included)."""
        while self._deferred and os.getpid() == self._pid:
            signum = self._deferred.pop(0)
            if threading.current_thread() is threading.main_thread():
                self._hand_on(signum, None)
            else:  # handlers belong to the main thread: send it again (it is free now)
                os.kill(os.getpid(), signum)

    def _hand_on(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_signals.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGTERM and prev in (signal.SIG_DFL, None):
            # The default action of SIGTERM is to terminate: do exactly that, after the bundle.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # SIGUSR1's default action would terminate the process; memwatch gives it the meaning
        # "write a bundle and go on", so a default USR1 handler is not re-raised.
