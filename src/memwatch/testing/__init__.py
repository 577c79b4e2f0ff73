"""Test doubles that ship with memwatch, for its own tests, its docs and users' tests:
:class:`FakeDevice` (a simulated CUDA caching allocator behind the device-probe protocol),
:class:`RecordedEvidence` (the live process, recorded: drive the analyzer's rules without one),
:func:`malloc_trim`, and :mod:`memwatch.testing.wandb_offline` (reads an offline W&B run back)."""

import socket
from pathlib import Path

from memwatch.testing.evidence import RecordedEvidence
from memwatch.testing.fake_device import FakeDevice, format_size, malloc_trim

__all__ = ["FakeDevice", "RecordedEvidence", "bundle_dirs", "format_size", "free_port",
           "malloc_trim"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a ``torch.distributed``
    rendezvous in a test: ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bundle_dirs(out_dir: str | Path) -> list[Path]:
    """The committed bundles under ``out_dir`` (its ``oom/`` folder), oldest first."""
    from memwatch.bundle import find_bundles

    d = Path(out_dir)
    if not (d / "oom").is_dir():
        return []
    return [p for p, b in find_bundles(d) if not isinstance(b, Exception)]
