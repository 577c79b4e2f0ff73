"""Acceptance (4): memwatch metrics reach an offline W&B run of ``Accelerator(log_with="wandb")``
through memwatch's W&B sink, which the hook adds on the tracker's run (``accelerator.log`` feeds
the other trackers): on the loop's own rows, read back from the run's ``.wandb`` transaction
log."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import pytest
from accelerate_helpers import session_story, setup, train, wandb_history

from memwatch import MemWatchWarning
from memwatch.integrations.accelerate import attach
from memwatch.testing import malloc_trim

wandb = pytest.importorskip("wandb")


def test_metrics_and_findings_reach_an_offline_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    # What earlier tests freed goes back to the kernel first: the planted 1 MiB a step would
    # otherwise refill that heap and RSS stay flat (failed once in a full run of the suite).
    import gc

    gc.collect()
    malloc_trim()
    acc, model, opt, data = setup(n_batches=48, batch_size=128, width=2048, log_with="wandb",
                                  project_dir=str(tmp_path))
    acc.init_trackers("memwatch-accelerate-test",
                      init_kwargs={"wandb": {"dir": str(tmp_path), "mode": "offline"}})
    run_dir = Path(acc.get_tracker("wandb", unwrap=True).dir).parent
    hook = attach(acc, opt, workers=False, log_every_n_steps=8)
    assert Path(hook.memwatch.out_dir) == tmp_path / "memwatch"  # under the project dir
    with caplog.at_level(logging.DEBUG, logger="memwatch"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(acc, model, opt, data, epochs=3, leak_from_epoch=1,
              after_step=lambda n: acc.log({"train/loss_seen": 1.0}, step=n))
    debug = [r.getMessage()[:300] for r in caplog.records if r.name.startswith("memwatch")]
    # (Not pytest.warns: when the warning does not come, the session's own figures say why; a
    # full suite beside two busy loops once ended without it, and told nothing more.)
    said = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]
    assert any("leak" in m for m in said), f"no leak warning ({said}):\n" + \
        session_story(hook.memwatch) + "\n  memwatch's debug log:\n    " + \
        "\n    ".join(debug[-40:])
    hook.detach()
    acc.end_training()

    # The offline writer is a separate process that may still be flushing after finish(): wait
    # for the last row the run logs (step 144: a sample and the last epoch's findings). Waiting
    # only for the first leak row (step 96) read the log before step 144 reached it, once.
    deadline = time.monotonic() + 30
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        logs = list(run_dir.glob("*.wandb"))
        rows = wandb_history(logs[0]) if logs else []
        if any(r.get("memwatch/step") == 144 for r in rows):
            break
        time.sleep(0.3)
    rss = [(r["memwatch/step"], r["memwatch/host.rss_gib"]) for r in rows
           if "memwatch/host.rss_gib" in r]
    # Every 8 optimizer steps, at memwatch's optimizer-step count (144 steps in 3 epochs), on the
    # loop's rows (the loop logs with explicit steps: the row still open when the sample of step
    # n comes is the loop's row n-1).
    assert [s for s, _ in rss] == list(range(8, 145, 8)), rss
    assert all(isinstance(v, float) and 0.01 < v < 64 for _, v in rss)
    # On the loop's own rows: none of memwatch's own, none dropped by W&B.
    assert [r["_step"] for r in rows] == list(range(1, 145))
    assert all("train/loss_seen" in r for r in rows)
    # An epoch end's check joins that step's row, still open (the loop logs with explicit steps).
    findings = [r for r in rows if "memwatch/findings/count" in r]
    assert [r["_step"] for r in findings] == [48, 96, 144]
    assert max(float(r.get("memwatch/findings/leak", 0)) for r in findings) >= 1  # type: ignore[arg-type]
    assert any(k.startswith("memwatch/findings/leak.") and k.endswith("_mib_per_step")
               for r in findings for k in r)
    tables = list(run_dir.glob("files/media/table/memwatch/findings_table_*.table.json"))
    assert tables, sorted(str(p) for p in run_dir.rglob("*"))
