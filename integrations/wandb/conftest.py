"""Set-up for the W&B sink end-to-end suites: each real framework with a real offline W&B run.

The tests reuse the tiny models of the framework suites (``integrations/lightning``,
``integrations/transformers``, ``integrations/accelerate``), and read every run back from its
directory with :mod:`memwatch.testing.wandb_offline`. Nothing is downloaded and nothing goes online.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent
for _d in ("lightning", "transformers", "accelerate"):
    _p = str(_HERE.parent / _d)
    if _p not in sys.path:
        sys.path.append(_p)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Lightning's own warnings on tiny CPU runs (see integrations/lightning/conftest.py).
_NOISE = (
    "ignore::lightning.fabric.utilities.warnings.PossibleUserWarning",
    "ignore:.*LeafSpec.*is deprecated:FutureWarning",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            for spec in _NOISE:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _offline_fresh_single_threaded(tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import wandb
    from lightning_helpers import malloc_trim

    for var, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                       ("WANDB_DIR", str(tmp_path)), ("WANDB_CONSOLE", "off"),
                       ("WANDB_PROJECT", "memwatch-test")):
        monkeypatch.setenv(var, value)
    for name in ("lightning.pytorch", "lightning.fabric", "transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    gc.collect()
    malloc_trim()  # a planted leak must show in RSS, not refill free lists of earlier tests
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    if wandb.run is not None:
        wandb.finish()
