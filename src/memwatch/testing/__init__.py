"""Test doubles that ship with memwatch, for its own tests, its docs and users' tests:
:class:`FakeDevice` (a simulated CUDA caching allocator behind the device-probe protocol),
:func:`malloc_trim`, and :mod:`memwatch.testing.wandb_offline` (reads an offline W&B run back)."""

from memwatch.testing.fake_device import FakeDevice, format_size, malloc_trim

__all__ = ["FakeDevice", "format_size", "malloc_trim"]
