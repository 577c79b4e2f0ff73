"""Failures: ``find_executable_batch_size`` retries are recovered OOMs (no bundle storm, the
final batch size reported); an OOM that ends the loop leaves a bundle.

OOMs are driven by :class:`memwatch.testing.FakeDevice`: each step "allocates activations"
proportional to the batch size on the fake device, whose allocator calls the OOM observers
(memwatch's pre-unwind capture) and raises ``torch.OutOfMemoryError`` as CUDA's does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size
from accelerate_helpers import Regressor, loader

from memwatch import MemWatchWarning
from memwatch.integrations.accelerate import attach
from memwatch.testing import FakeDevice, bundle_dirs

MIB = 1 << 20


def test_batch_size_finder_retries_are_recovered_ooms(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=64 * MIB)
    acc = Accelerator(cpu=True)
    model = Regressor(64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    hook = attach(acc, opt, device=dev, workers=False, out_dir=str(tmp_path))

    @find_executable_batch_size(starting_batch_size=128)
    def inner(batch_size: int) -> int:
        data = acc.prepare(loader(6, batch_size))
        for x, y in data:
            activations = dev.malloc(batch_size * MIB)  # 1 MiB per sample: 128 does not fit
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            dev.free(activations)
        return batch_size

    # The finder settles on a batch that fills 91% of the device: memwatch says so.
    with pytest.warns(MemWatchWarning, match="near_oom"):
        final = inner()
    # 128 -> 115 -> 103 -> 92 -> 82 -> 73 -> 65 OOM; 58 fits (int(b * 0.9) each time).
    assert final == 58
    assert hook.batch_size == 58
    assert hook.recovered_oom_count == 7 == dev.ooms
    assert [e["batch_size"] for e in hook.recovered_ooms] == [58]
    assert hook.recovered_ooms[0]["tried_to_allocate"] >= 65 * MIB
    assert hook.memwatch.step_count == 6 and hook.memwatch.epoch == 1
    hook.detach()
    assert bundle_dirs(tmp_path) == []  # no bundle for OOMs the program recovered from


def test_an_oom_that_ends_the_loop_leaves_one_bundle(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=64 * MIB)
    acc = Accelerator(cpu=True)
    model = Regressor(64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, data = acc.prepare(model, opt, loader(8, 16))
    kept = []
    with pytest.raises(torch.OutOfMemoryError):
        with attach(acc, opt, device=dev, workers=False, out_dir=str(tmp_path)) as hook:
            for x, y in data:
                kept.append(dev.malloc(10 * MIB))  # a runaway cache on the device
                acc.backward(F.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
    assert hook.bundle_path is not None and hook.bundle_path.exists()
    assert bundle_dirs(tmp_path) == [hook.bundle_path]
    assert len(opt.optimizer._optimizer_step_post_hooks) == 0  # detached on the way out


def test_an_oom_the_loop_catches_itself_is_not_a_batch_size_retry(tmp_path: Path) -> None:
    # Outside find_executable_batch_size the hook claims nothing: the recorder keeps the
    # pre-unwind capture and writes it as an "oom_observer" bundle, as it does without Accelerate.
    dev = FakeDevice(total_bytes=64 * MIB)
    acc = Accelerator(cpu=True)
    model = Regressor(64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, data = acc.prepare(model, opt, loader(6, 16))
    hook = attach(acc, opt, device=dev, workers=False, out_dir=str(tmp_path))
    skipped = 0
    for i, (x, y) in enumerate(data):
        try:
            h = dev.malloc((100 if i == 2 else 1) * MIB)  # one oversized batch
        except torch.OutOfMemoryError:
            skipped += 1
            continue
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        dev.free(h)
    assert skipped == 1 and hook.memwatch.step_count == 5
    assert hook.recovered_oom_count == 0 and hook.batch_size is None
    hook.detach()
    bundles = bundle_dirs(tmp_path)
    assert len(bundles) == 1
    assert json.loads((bundles[0] / "manifest.json").read_text())["trigger"] == "oom_observer"
