"""Objects that must act in a forked child (a DataLoader worker): one ``os.register_at_fork``
hook per kind of object, for all its live instances (hooks cannot be unregistered, so one per
instance would pile up).

Example::

    >>> from memwatch.core.forking import ForkRegistry
    >>> seen = []
    >>> class Probe:
    ...     def after_fork_in_child(self) -> None:
    ...         seen.append(self)
    >>> registry = ForkRegistry("after_fork_in_child")
    >>> p = Probe()
    >>> registry.add(p)
    >>> registry.run_in_child()  # what the fork hook does in the child
    >>> seen == [p]
    True
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["ForkRegistry"]


class ForkRegistry:
    """Calls ``method`` of every live registered object in a forked child."""

    def __init__(self, method: str) -> None:
        self.method = method
        self._objects: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hooked = False

    def add(self, obj: Any) -> None:
        self._objects.add(obj)
        if not self._hooked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.run_in_child)
            self._hooked = True

    def run_in_child(self) -> None:
        for obj in list(self._objects):
            getattr(obj, self.method)()
