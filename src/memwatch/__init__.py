"""memwatch: watches memory during deep-learning training and says what is leaking and why.

Example::

    >>> import memwatch
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
    ...     mw.step()
    >>> mw.step_count, mw.latest()["host.rss"] > 0
    (1, True)
"""

from memwatch._version import __version__
from memwatch.analysis.context import AnalyzerConfig
from memwatch.core.errors import BundleError, ConfigError, MemwatchError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.runtime.watchdog import Alert, WatchdogConfig
from memwatch.session import MemWatch, WatchConfig, watch

__all__ = [
    "Alert",
    "AnalyzerConfig",
    "BundleError",
    "ConfigError",
    "Finding",
    "MemWatch",
    "MemWatchWarning",
    "MemwatchError",
    "WatchConfig",
    "WatchdogConfig",
    "__version__",
    "watch",
]
