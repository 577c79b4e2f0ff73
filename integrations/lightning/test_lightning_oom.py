"""Acceptance (3): a run that dies of a (host) OOM leaves a flight-recorder bundle via
``on_exception``, logged to the trainer's loggers while they are still open.

The OOM is real: a child process caps its address space (RLIMIT_AS) after importing torch and
Lightning, then a runaway cache in ``training_step`` grows until the CPU allocator fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import json, resource, sys, warnings
    sys.path.insert(0, {here!r})
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    from lightning_helpers import Regressor, loader, make_trainer
    from memwatch.integrations.lightning import MemWatchCallback

    out = {out!r}
    cb = MemWatchCallback(workers=False, out_dir=out + "/memwatch", signals=False)
    trainer = make_trainer(__import__("pathlib").Path(out), [cb], max_epochs=50,
                           limit_val_batches=0, log_every_n_steps=1)
    model = Regressor(width=16, hog_mib=64)
    data = loader(8, 8)

    def vm_size():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    # 1.5 GiB of headroom over what is mapped now: the 64 MiB-a-step cache exhausts it.
    limit = vm_size() + (3 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    try:
        trainer.fit(model, data)
    except BaseException as e:
        print(json.dumps({{"exc": type(e).__name__, "msg": str(e)[:300],
                          "bundle": None if cb.bundle_path is None else str(cb.bundle_path),
                          "steps": trainer.global_step,
                          "attr": str(getattr(e, "memwatch_bundle", None))}}), flush=True)
        raise
    print(json.dumps({{"exc": None}}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS semantics: Linux")
def test_host_oom_leaves_a_bundle_logged_to_the_loggers(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=str(HERE), out=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1])
    # The run died of the OOM, and the original exception reached the user unchanged.
    assert proc.returncode != 0
    assert report["exc"] == "RuntimeError", report
    assert "can't allocate memory" in report["msg"]
    assert "can't allocate memory" in proc.stderr
    assert report["steps"] >= 3  # it trained (and was sampled) before dying

    assert report["bundle"], (report, proc.stderr[-3000:])
    bundle = Path(report["bundle"])
    assert bundle.exists()
    assert str(tmp_path / "memwatch") in str(bundle)
    # Logged while the loggers were open: CSVLogger keeps hyperparameters in hparams.yaml and
    # the `memwatch/oom` marker in metrics.csv.
    hparams = list((tmp_path / "csv").glob("version_*/hparams.yaml"))
    assert hparams and str(bundle) in hparams[0].read_text()
    metrics = list((tmp_path / "csv").glob("version_*/metrics.csv"))
    assert metrics and "memwatch/oom" in metrics[0].read_text()
