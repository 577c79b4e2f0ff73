"""Layer 6, the one object users and integrations drive: :class:`MemWatch` and :func:`watch`."""

from memwatch.session.session import MemWatch, rank_info, watch

__all__ = ["MemWatch", "rank_info", "watch"]
