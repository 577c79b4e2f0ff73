"""On a real CUDA device (``pytest -m gpu``): fp16 overflow skips and real OOM retries.

Not run on the CPU-only development machine (written against the code paths the CPU suites
exercise with a CPU GradScaler and FakeDevice).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size
from accelerate_helpers import Regressor, loader

from memwatch import MemWatchWarning
from memwatch.integrations.accelerate import attach

pytestmark = pytest.mark.gpu


def test_fp16_overflow_steps_are_not_samples(tmp_path: Path) -> None:
    acc = Accelerator(mixed_precision="fp16")
    model = Regressor(256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, data = acc.prepare(model, opt, loader(12, 32))
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    assert hook.memwatch.device is not None and hook.memwatch.device.kind == "cuda"
    skipped = 0
    for i, (x, y) in enumerate(data):
        with acc.autocast():
            loss = F.mse_loss(model(x), y)
        acc.backward(loss)
        if i % 4 == 1:
            for p in model.parameters():
                p.grad.fill_(float("inf"))
        opt.step()
        opt.zero_grad()
        skipped += int(opt.step_was_skipped)
    assert skipped >= 3
    assert hook.memwatch.step_count == 12 - skipped
    hook.detach()


def test_real_cuda_oom_retries_are_recovered(tmp_path: Path) -> None:
    acc = Accelerator()
    model = Regressor(256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), census="never")
    free, _ = torch.cuda.mem_get_info()
    per_sample = free // 100  # a batch of 128 cannot fit; ~90 can

    @find_executable_batch_size(starting_batch_size=128)
    def inner(batch_size: int) -> int:
        data = acc.prepare(loader(4, batch_size))
        for x, y in data:
            activations = torch.empty(batch_size * per_sample, dtype=torch.uint8,
                                      device=acc.device)
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            del activations
        return batch_size

    with warnings.catch_warnings():
        # The batch it finds is close to the limit by construction: near_oom may be reported.
        warnings.simplefilter("ignore", MemWatchWarning)
        final = inner()
    assert final < 128
    assert hook.batch_size == final
    assert hook.recovered_oom_count >= 1
    hook.detach()
    root = tmp_path / "oom"
    assert not root.exists() or not [p for p in root.iterdir() if p.is_dir()]
