"""Layer 6, the one object users and integrations drive: :class:`MemWatch` (and :func:`watch`),
configured by one validated value, :class:`WatchConfig`; its options as keyword arguments are
typed by :class:`~memwatch.session.options.WatchOptions` (``AdapterOptions`` for the adapters,
which take ``log_every_n_steps`` and ``warn`` themselves)."""

from memwatch.runtime.exchange import rank_info
from memwatch.session.config import WatchConfig
from memwatch.session.options import AdapterOptions, Unpack, WatchOptions
from memwatch.session.session import MemWatch
from memwatch.session.view import SessionReader
from memwatch.session.watch import watch

__all__ = ["AdapterOptions", "MemWatch", "SessionReader", "Unpack", "WatchConfig", "WatchOptions",
           "rank_info", "watch"]
