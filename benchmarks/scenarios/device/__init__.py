"""Scripted device series on :class:`memwatch.testing.FakeDevice`: leak, fragmentation, plateau and
step shapes of accelerator memory, with the step a series runs out of memory at."""
