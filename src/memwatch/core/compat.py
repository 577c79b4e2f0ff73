"""Typing helpers the package needs on every Python it supports (3.10 and later) without a
dependency: :func:`override`.

Example::

    >>> from memwatch.core.compat import override
    >>> class Base:
    ...     def hook(self) -> None: ...
    >>> class Child(Base):
    ...     @override
    ...     def hook(self) -> None: ...
    >>> Child.hook.__override__
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["override"]

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # the type checker's own (typing_extensions ships with it): it checks the base
    from typing_extensions import override
elif sys.version_info >= (3, 12):
    from typing import override
else:
    def override(method: F) -> F:
        """Marks a method that overrides one of a base class (a framework's hook): a type
        checker fails when the base has no such method, so a hook renamed by the framework
        does not go silent. At run time it only sets ``__override__``, as
        ``typing.override`` does."""
        try:
            method.__override__ = True  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
        return method
