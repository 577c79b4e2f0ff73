"""A read-only attribute of the session that one of its parts owns (:class:`Part`)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

__all__ = ["Part"]

T = TypeVar("T")


class Part(Generic[T]):
    """``MemWatch.findings`` reads ``mw._checker.findings``: the checker writes it, the session
    reads it through. Nothing can be assigned through a ``Part`` (each attribute has one
    writer).

    Example::

        >>> class Box:
        ...     def __init__(self):
        ...         self._inner = type("Inner", (), {"n": 3})()
        ...     n: Part[int] = Part("_inner", "n")
        >>> Box().n
        3
        >>> Box().n = 4
        Traceback (most recent call last):
        ...
        AttributeError: Box.n is read-only: it belongs to Box._inner
    """

    def __init__(self, part: str, name: str) -> None:
        #: The attribute of the owner that holds the part ("" for the owner itself).
        self.part = part
        self.name = name
        self._attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self._attr = f"{owner.__name__}.{attr}"

    @overload
    def __get__(self, obj: None, owner: type) -> Part[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Any:
        if obj is None:
            return self
        holder = getattr(obj, self.part) if self.part else obj
        return getattr(holder, self.name)

    def __set__(self, obj: object, value: Any) -> None:
        where = f"{type(obj).__name__}.{self.part}" if self.part else "its own state"
        raise AttributeError(f"{self._attr} is read-only: it belongs to {where}")
