"""``memwatch.watch(...)``: a :class:`~memwatch.session.session.MemWatch` as a context manager,
started on entry and closed on exit, a failure inside recorded on the way out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from memwatch.session.session import MemWatch

if TYPE_CHECKING:
    from typing import Unpack

    from memwatch.session.options import WatchOptions

__all__ = ["watch"]


@contextmanager
def watch(**options: Unpack[WatchOptions]) -> Iterator[MemWatch]:
    """Context-manager form of :class:`MemWatch`: started on entry, closed on exit.

    Example::

        >>> import memwatch
        >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
        ...     for _ in range(3):
        ...         mw.step()
        >>> mw.step_count
        3
    """
    mw = MemWatch(**options)
    mw.start()
    try:
        yield mw
    except BaseException as e:
        mw.handle_exception(e)  # a bundle when configured; the exception propagates unchanged
        raise
    finally:
        mw.close()
