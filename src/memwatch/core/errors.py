"""memwatch's small error hierarchy.

Configuration errors are ``ValueError`` subclasses so that ``except ValueError`` in user code keeps
working; everything memwatch raises on purpose derives from :class:`MemwatchError`.
"""

from __future__ import annotations


class MemwatchError(Exception):
    """Root of every error memwatch raises on purpose."""


class ConfigError(MemwatchError, ValueError):
    """A constructor argument is invalid. The message names the option and the fix."""


class BundleError(MemwatchError):
    """An OOM bundle is missing, truncated, corrupted or of an unknown schema."""


class UnsafePickleError(BundleError):
    """A snapshot pickle references something other than plain containers."""


class FakeOutOfMemoryError(MemwatchError, RuntimeError):
    """Raised by :class:`memwatch.testing.FakeDevice` when torch is not importable.

    With torch present the fake raises ``torch.OutOfMemoryError`` instead, exactly like the real
    caching allocator.
    """


class MemWatchWarning(UserWarning):
    """Emitted by the framework integrations once per new finding (a leak, fragmentation, an OOM
    forecast...). Filter it like any warning: ``warnings.simplefilter("ignore", MemWatchWarning)``.
    """
