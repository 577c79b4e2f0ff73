"""memwatch: watches memory during deep-learning training and says what is leaking and why.

Example::

    >>> import memwatch
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
    ...     mw.step()
    >>> sorted(mw.latest())[:2]
    ['host.pss', 'host.rss']
"""

from memwatch._version import __version__
from memwatch.core.errors import BundleError, ConfigError, MemwatchError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.session import MemWatch, watch

__all__ = [
    "BundleError",
    "ConfigError",
    "Finding",
    "MemWatch",
    "MemWatchWarning",
    "MemwatchError",
    "__version__",
    "watch",
]
