"""Set-up for the Lightning end-to-end suites (real ``Trainer.fit`` on CPU, tiny models).

pytest runs with warnings as errors. Lightning itself warns on every small CPU run (too few
DataLoader workers, a logging interval longer than the epoch) and torch deprecates an API Lightning
still calls; those are not memwatch's and are ignored here, by category and message, so that any
warning memwatch emits still fails a test that does not expect it.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lightning_helpers import malloc_trim

_HERE = Path(__file__).resolve().parent

LIGHTNING_NOISE = (
    "ignore::lightning.fabric.utilities.warnings.PossibleUserWarning",
    "ignore:.*LeafSpec.*is deprecated:FutureWarning",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            for spec in LIGHTNING_NOISE:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _quiet_single_threaded() -> Iterator[None]:
    # Lightning prints accelerator summaries and tips at INFO on every Trainer: keep logs readable.
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Each test is a "fresh process" for host memory: memory freed by an earlier test would
    # otherwise stay in glibc's free lists, and a planted leak would refill it without RSS
    # moving (a restart in real life starts a new process with no such pool).
    gc.collect()
    malloc_trim()
    # These models are tiny: on a shared 2-core machine, torch's intra-op threads only fight the
    # other processes (a step took 14x longer with 2 threads under load than with 1).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

