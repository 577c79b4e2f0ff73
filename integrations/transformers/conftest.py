"""Set-up for the transformers end-to-end suites (real ``Trainer.train`` on CPU, tiny BERTs).

Nothing is downloaded (``HF_HUB_OFFLINE=1``; models are built from configs). pytest runs with
warnings as errors, so any warning memwatch emits fails a test that does not expect it.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator

import pytest
import torch
from hf_helpers import malloc_trim

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _fresh_and_single_threaded() -> Iterator[None]:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # Each test starts like a fresh process for host memory: memory freed by an earlier test would
    # otherwise sit in glibc's free lists and a planted leak would refill it without RSS moving.
    gc.collect()
    malloc_trim()
    # Tiny models on a shared 2-core machine: extra intra-op threads only fight other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
