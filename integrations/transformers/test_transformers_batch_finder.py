"""Acceptance (5): ``auto_find_batch_size=True`` with OOMs driven by a FakeDevice.

Accelerate's ``find_executable_batch_size`` catches each OOM and calls the training loop again
with 90% of the batch. Each OOM fires the device's OOM observer (memwatch's flight recorder
captures evidence pre-unwind), but the program recovers: memwatch must record a recovered OOM
(an event, or one small bundle when asked), never a bundle per retry, and report the final batch
size. Also: ``skip_memory_metrics=False`` (transformers' tracker resets peak statistics) leaves
memwatch's per-step peaks right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hf_helpers import DeviceHungryTrainer, Tokens, make_args, tiny_bert
from transformers import TrainerCallback

from memwatch.integrations.transformers import MemWatchCallback
from memwatch.testing import FakeDevice, bundle_dirs

MIB = 1 << 20


def _run(tmp_path: Path, recovered_oom: str) -> tuple[MemWatchCallback, DeviceHungryTrainer,
                                                       FakeDevice]:
    # 8 MiB per sample on a 110 MiB device: 16 (128 MiB) and 14 (112 MiB) fail, 12 (96 MiB) fits,
    # below the watchdog's near-OOM margin (90%), so the finished run is quiet.
    dev = FakeDevice(total_bytes=110 * MIB)
    cb = MemWatchCallback(workers=False, device=dev, recovered_oom=recovered_oom)
    args = make_args(tmp_path, auto_find_batch_size=True, per_device_train_batch_size=16,
                     num_train_epochs=1, logging_steps=2)
    trainer = DeviceHungryTrainer(tiny_bert(), args, train_dataset=Tokens(48), callbacks=[cb],
                                  device=dev, bytes_per_sample=8 * MIB)
    trainer.train()
    return cb, trainer, dev


def test_recovered_ooms_are_events_and_the_final_batch_size_is_reported(tmp_path: Path) -> None:
    cb, trainer, dev = _run(tmp_path, "event")
    assert dev.ooms == 2  # two real OOMs went through the observer path
    assert trainer.batch_sizes[0] == 16 and trainer.batch_sizes[-1] == 12
    assert [e["batch_size"] for e in cb.recovered_ooms] == [16, 14]
    assert [e["tried_to_allocate"] for e in cb.recovered_ooms] == [128 * MIB, 112 * MIB]
    assert all(e["bundle"] is None for e in cb.recovered_ooms)
    assert cb.train_batch_size == 12
    # No bundle storm: none at all in "event" mode.
    assert bundle_dirs(tmp_path / "out" / "memwatch") == []
    assert cb.bundle_path is None
    # The finished attempt was watched on its own (a fresh timeline for the batch that fits).
    assert cb.memwatch is not None and cb.memwatch.step_count == 4  # 48 samples / 12
    hist = trainer.state.log_history
    sizes = [r["memwatch/train_batch_size"] for r in hist if "memwatch/train_batch_size" in r]
    assert sizes == [12]
    assert max(r.get("memwatch/recovered_ooms", 0) for r in hist) == 2


def test_recovered_oom_bundle_mode_writes_one_small_bundle(tmp_path: Path) -> None:
    cb, _, dev = _run(tmp_path, "bundle")
    assert dev.ooms == 2
    bundles = bundle_dirs(tmp_path / "out" / "memwatch")
    assert len(bundles) == 1, bundles  # the first recovered OOM only
    assert cb.recovered_ooms[0]["bundle"] == str(bundles[0])
    assert cb.recovered_ooms[1]["bundle"] is None
    files = {p.name for p in bundles[0].iterdir()}
    assert "snapshot.pickle" not in files and "manifest.json" in files
    assert "recovered" in (bundles[0] / "manifest.json").read_text()


class _ResetPeaks(TrainerCallback):
    """What ``torch.cuda.reset_peak_memory_stats`` does to the allocator, at every step start
    (transformers' tracker does it at each stage start; per step is the harshest case)."""

    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev
        self.calls = 0

    def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        self.dev.reset_peak()
        self.calls += 1


def _peak_run(tmp_path: Path, reset: bool) -> tuple[np.ndarray, int, dict[str, float]]:
    dev = FakeDevice(total_bytes=1 << 30)
    base = dev.malloc(4 * MIB)  # resident weights
    cb = MemWatchCallback(workers=False, device=dev)
    args = make_args(tmp_path, skip_memory_metrics=False, per_device_train_batch_size=8,
                     num_train_epochs=1, logging_steps=2)
    resets = _ResetPeaks(dev)
    extra = [resets] if reset else []
    trainer = DeviceHungryTrainer(tiny_bert(), args, train_dataset=Tokens(48),
                                  callbacks=[cb, *extra], device=dev, bytes_per_sample=2 * MIB)
    trainer.train()
    assert cb.memwatch is not None and cb.memwatch.timeline is not None
    _, peaks = cb.memwatch.timeline.series("device.peak")
    _, alloc = cb.memwatch.timeline.series("device.allocated")
    assert np.all(alloc == 4 * MIB), alloc
    dev.free(base)
    # memwatch never resets the allocator's peak itself (others rely on it).
    assert reset or dev.max_allocated == 20 * MIB
    return peaks, resets.calls, trainer.state.log_history[-1]


def test_peaks_stay_right_with_transformers_memory_metrics(tmp_path: Path) -> None:
    # Each step: 4 MiB resident + 16 MiB of activations, freed before the step ends.
    plain, _, final = _peak_run(tmp_path / "plain", reset=False)
    # transformers' tracker really ran alongside (its metrics are in the final log row).
    assert any(k.startswith("train_mem_cpu") for k in final), final
    reset, calls, _ = _peak_run(tmp_path / "reset", reset=True)
    assert calls == 6
    # The run's peak is right, no sample is above the true peak or below the allocation, and
    # peak resets by somebody else change nothing in memwatch's series.
    assert len(reset) == 6 and reset.max() == 20 * MIB
    assert np.all((reset >= 4 * MIB) & (reset <= 20 * MIB)), reset
    assert np.array_equal(reset, plain), (reset, plain)
