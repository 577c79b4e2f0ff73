"""Acceptance (3): a run that dies of a (host) OOM leaves a bundle although no callback event
fires on a crash (``TrainerCallback`` has no exception hook and ``on_train_end`` does not run).

The OOM is real: a child process caps its address space (RLIMIT_AS) after its imports, then a
runaway cache in ``compute_loss`` grows until the CPU allocator fails. The exception leaves
``trainer.train()`` uncaught; the flight recorder's chained ``sys.excepthook`` (installed at
``on_train_begin``) writes the bundle. :func:`watch_trainer` is checked in-process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hf_helpers import Tokens, make_args, tiny_bert
from transformers import Trainer

from memwatch.integrations.transformers import MemWatchCallback, watch_trainer

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import os, resource, sys, warnings
    sys.path.insert(0, {here!r})
    warnings.simplefilter("ignore")
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    torch.set_num_threads(1)
    from pathlib import Path
    from transformers import Trainer, TrainerCallback
    from hf_helpers import Tokens, make_args, tiny_bert
    from memwatch.integrations.transformers import MemWatchCallback

    class Hog(Trainer):
        cache = []
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.cache.append(torch.ones(64 << 18))  # a runaway cache: 64 MiB a step
            return model(**inputs).loss

    class Events(TrainerCallback):
        def on_train_end(self, args, state, control, **kw):
            print("on_train_end ran", flush=True)

    out = Path({out!r})
    cb = MemWatchCallback(workers=False, signals=False)
    args = make_args(out, num_train_epochs=1000, per_device_train_batch_size=2, logging_steps=1)
    trainer = Hog(tiny_bert(), args, train_dataset=Tokens(8), callbacks=[cb, Events()])

    def vm_size():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    # 1 GiB of headroom over what is mapped now: the 64 MiB-a-step cache exhausts it.
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (1 << 30), resource.RLIM_INFINITY))
    trainer.train()  # dies here; nothing catches the exception
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS semantics: Linux")
def test_host_oom_leaves_a_bundle_without_any_callback_event(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=str(HERE), out=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240)
    # The run died of the OOM; the original traceback reached stderr unchanged.
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "can't allocate memory" in proc.stderr, proc.stderr[-3000:]
    assert "on_train_end ran" not in proc.stdout  # no callback event on a crash
    bundles = sorted(p for p in (tmp_path / "out" / "memwatch" / "oom").iterdir() if p.is_dir())
    assert len(bundles) == 1, bundles
    manifest = json.loads((bundles[0] / "manifest.json").read_text())
    assert manifest["classification"] == "host_oom", manifest
    assert manifest["step"] >= 3  # it trained (and was sampled) before dying
    assert "memwatch: diagnostic bundle written to" in proc.stderr  # the note on the exception


class _Failing(Trainer):
    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        if self.state.global_step >= 2:
            raise ValueError("boom: a bug in compute_loss")
        return model(**inputs).loss


def test_watch_trainer_guarantees_handle_exception(tmp_path: Path) -> None:
    args = make_args(tmp_path, num_train_epochs=1, per_device_train_batch_size=2)
    trainer = _Failing(tiny_bert(), args, train_dataset=Tokens(16))
    with pytest.raises(ValueError, match="boom") as info:
        with watch_trainer(trainer, workers=False, signals=False, bundle_on="all") as cb:
            trainer.train()
    assert isinstance(cb, MemWatchCallback) and cb in trainer.callback_handler.callbacks
    # The exception is the user's, unchanged, tagged with the bundle it left.
    assert cb.bundle_path is not None and cb.bundle_path.exists()
    assert info.value.memwatch_bundle == cb.bundle_path  # type: ignore[attr-defined]
    manifest = json.loads((cb.bundle_path / "manifest.json").read_text())
    assert manifest["classification"] == "other" and manifest["step"] == 2
    # The trainer's own log path carried the marker; every session is closed afterwards.
    assert any(r.get("memwatch/oom") == 1.0 for r in trainer.state.log_history)
    assert cb.memwatch is not None and not cb.memwatch.running


class _DiesBeforeTraining(Trainer):
    def get_train_dataloader(self) -> Any:
        raise MemoryError("the dataset did not fit")  # before on_train_begin


def test_watch_trainer_bundle_for_a_failure_before_train_begin(tmp_path: Path) -> None:
    args = make_args(tmp_path, num_train_epochs=1)
    trainer = _DiesBeforeTraining(tiny_bert(), args, train_dataset=Tokens(8))
    with pytest.raises(MemoryError) as info:
        with watch_trainer(trainer, workers=False, signals=False) as cb:
            trainer.train()
    assert cb.memwatch is None  # no training session ever started
    assert cb.bundle_path is not None
    assert info.value.memwatch_bundle == cb.bundle_path  # type: ignore[attr-defined]
    manifest = json.loads((cb.bundle_path / "manifest.json").read_text())
    assert manifest["classification"] == "host_oom"
    assert str(tmp_path / "out" / "memwatch") in str(cb.bundle_path)
