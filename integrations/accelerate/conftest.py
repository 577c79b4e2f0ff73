"""Set-up for the Accelerate end-to-end suites (a real ``Accelerator`` on CPU, tiny models).

pytest runs with warnings as errors, so any warning memwatch emits fails a test that does not
expect it.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest
import torch
from accelerate_helpers import malloc_trim, reset_accelerate


@pytest.fixture(autouse=True)
def _fresh_process_like() -> Iterator[None]:
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    # Accelerate keeps process-wide singletons (AcceleratorState, GradientState): each test
    # starts from a blank one, as a new process would.
    reset_accelerate()
    # Memory freed by an earlier test would stay in glibc's free lists, and a planted leak would
    # refill it without RSS moving (a restart in real life starts a new process with no pool).
    gc.collect()
    malloc_trim()
    # Tiny models on a shared 2-core machine: intra-op threads only fight the other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    reset_accelerate()
