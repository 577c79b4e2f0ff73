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


class UnsafePathError(MemwatchError, OSError):
    """A path memwatch was about to write or read is not safe: a symlink where a file or
    directory of its own should be, a directory owned or writable by another user, a FIFO or
    device where a regular file should be, a file over its size cap. The message names the path
    and the fix. An ``OSError``, so that a writer's ``except OSError`` (warn and go on) covers it.
    """


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
