"""One session, one training thread: the thread whose ``step()`` calls a session samples
(:class:`TrainingThread`)."""

from __future__ import annotations

import threading
import warnings

from memwatch.core.costs import Costs
from memwatch.core.errors import MemWatchWarning

__all__ = ["TrainingThread"]


class TrainingThread:
    """Which thread a session's ``step()`` belongs to. The first call binds it (and the cost
    budget starts counting that thread's CPU time); a call from another thread after that is
    ignored, with one warning: samples from two threads would interleave and the step count
    would lose meaning.

    Example::

        >>> from memwatch.core.costs import Costs
        >>> t = TrainingThread(Costs())
        >>> t.other(), t.other()  # the first call binds this thread
        (False, False)
    """

    def __init__(self, costs: Costs) -> None:
        self._costs = costs
        #: The bound thread's identifier (None until the first ``step()``).
        self.ident: int | None = None
        self._warned = False

    def other(self) -> bool:
        """True for a call from a thread other than the bound one (warned about once); the
        first call binds the calling thread."""
        if self.ident is None:
            self.ident = threading.get_ident()
            self._costs.bind()  # the budget counts this thread's CPU time from here
            return False
        if threading.get_ident() == self.ident:
            return False
        if not self._warned:
            self._warned = True
            warnings.warn(
                "memwatch: MemWatch.step() was called from a thread other than the one that "
                "started the session; such calls are ignored (one session samples one training "
                "thread: start it from the thread that trains, or give each thread its own "
                "session).", MemWatchWarning, stacklevel=3)
        return True

    def hand_over(self) -> None:
        """The calling thread steps the session from now on."""
        self.ident = threading.get_ident()
        self._costs.bind()
        self._warned = False
