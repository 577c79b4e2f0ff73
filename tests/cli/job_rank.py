"""One rank of a pretend distributed job for tests/test_cli_jobs.py (FakeDevice, no torch).

    RANK=1 WORLD_SIZE=2 python job_rank.py OUT_DIR fail|run

``fail``: steps with a growing FakeDevice allocation, then an allocation that cannot fit (a
device OOM, bundle written). ``run``: steps until SIGTERM (memwatch's handler writes a bundle).
Prints ``ready`` once it has samples, so the test knows when to start the other rank.
"""

from __future__ import annotations

import sys
import time

import memwatch
from memwatch.testing import FakeDevice

MIB = 1 << 20


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    dev = FakeDevice(total_bytes=512 * MIB)
    held = []
    with memwatch.watch(device=dev, workers=False, out_dir=out, signals=True,
                        interval_s=0.05) as mw:
        for step in range(100_000):
            held.append(dev.malloc((2 if mode == "fail" else 1) * MIB if step < 150 else 4096))
            mw.step()
            if step == 30:
                print("ready", flush=True)
            if step % 40 == 39:
                mw.end_epoch()
            if mode == "fail" and step == 120:
                dev.malloc(1 << 40)  # FakeOutOfMemoryError: the bundle is written, then it raises
            time.sleep(0.01)


if __name__ == "__main__":
    main()
