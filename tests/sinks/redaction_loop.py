"""A plain loop that leaks into a dict whose key is token-shaped (``store['hf_...']``), watched
with every way out of the process: the black box, a JSONL log, an offline W&B run, a report of
the live run and a bundle. For ``test_redacted_everywhere.py``; runs in its own interpreter.

Usage: python redaction_loop.py OUT_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Fake, in the Hugging Face token format; the test looks for its tail in every file written.
TOKEN = "hf_" + "Qz7Lm2Kp4Zr8Tn6Vb3Wc5Yd1Fg0Hj" + "LEAKEDTAIL"
store: dict[str, list[object]] = {TOKEN: []}


def main(out: Path) -> None:
    import numpy as np
    import wandb

    import memwatch
    from memwatch.report.html import render_run
    from memwatch.sinks import JsonlSink
    from memwatch.sinks.wandb import WandbSink

    run = wandb.init(project="memwatch-redaction", dir=str(out))
    sinks = [JsonlSink(out / "events.jsonl"), WandbSink()]
    with memwatch.watch(device="cpu", workers=False, out_dir=out / "mw", signals=False,
                        sinks=sinks, log_every_n_steps=10, census="always",
                        blackbox_every_s=0.2, interval_s=0.1) as mw:
        for _epoch in range(4):
            for _ in range(150):
                store[TOKEN].append(np.ones(100 * 1024 // 8))
                mw.step()
            fs = mw.end_epoch()
            print([f.culprit for f in fs if f.kind == "leak"], flush=True)
        assert mw.blackbox is not None
        mw.blackbox.write()
        os.link(mw.blackbox.path, out / "blackbox-copy.json")  # it is removed at close
        render_run(mw, out / "report.html")
        mw.dump("with the leak in it")
    run.finish()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
