"""The failure rule of a session's parts: a part that fails is turned off with one warning
naming the cause, and training goes on (:class:`Faults`)."""

from __future__ import annotations

import logging

__all__ = ["Faults"]

log = logging.getLogger("memwatch")


class Faults:
    """Components of one session turned off after an error.

    Every part of a session gets this one object: ``name in faults`` asks whether a component
    is off, :meth:`disable` turns it off (once; one warning).

    Example::

        >>> faults = Faults()
        >>> faults.disable("watchdog", RuntimeError("boom"))
        >>> "watchdog" in faults, faults.disabled
        (True, {'watchdog': 'RuntimeError: boom'})
    """

    def __init__(self) -> None:
        #: Component name -> the error that turned it off.
        self.disabled: dict[str, str] = {}

    def __contains__(self, component: object) -> bool:
        return component in self.disabled

    def disable(self, component: str, exc: BaseException) -> None:
        """Turn ``component`` off after ``exc`` (the first cause is kept)."""
        if component in self.disabled:
            return
        self.disabled[component] = f"{type(exc).__name__}: {exc}"
        log.warning("memwatch: %s disabled after an error (%s: %s); training continues",
                    component, type(exc).__name__, exc)
