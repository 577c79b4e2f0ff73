"""Layer 6, the one object users and integrations drive: :class:`MemWatch` (and :func:`watch`),
configured by one validated value, :class:`WatchConfig`."""

from memwatch.session.config import WatchConfig
from memwatch.session.session import MemWatch, SessionReader, rank_info, watch

__all__ = ["MemWatch", "SessionReader", "WatchConfig", "rank_info", "watch"]
