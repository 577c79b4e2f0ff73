"""Cost of memwatch's epoch-end exchange across ranks (2 real gloo processes on this machine).

Launches `torchrun --nproc_per_node 2` on a worker that runs 20 epoch ends of a tiny loop and
records, on rank 0, the pickled bytes each rank sends and the exchange's wall time (barrier +
gather), and the one-time set-up in start() (memwatch's gloo group + the job-id broadcast).
Prints a table and writes benchmarks/results/rank_exchange.json, with the linear extrapolation
to 1,024 ranks (what rank 0 receives per epoch).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
WORKER = r'''
import json, sys, torch, torch.distributed as dist, memwatch
dist.init_process_group("gloo")
out = []
with memwatch.watch(device="cpu", workers=False, out_dir=sys.argv[1] + f"/r{dist.get_rank()}",
                    signals=False, census="never") as mw:
    for epoch in range(20):
        for _ in range(20):
            mw.step()
        mw.end_epoch()
        out.append((mw._checker.exchange.last_bytes, mw._checker.exchange.last_ms))
if dist.get_rank() == 0:
    json.dump({"epochs": out, "setup_ms": mw._checker.exchange.setup_ms},
              open(sys.argv[1] + "/rank0.json", "w"))
dist.destroy_process_group()
'''


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "worker.py"
        script.write_text(WORKER)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--master_addr=127.0.0.1", f"--master_port={port}", str(script), d],
                       check=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
        doc = json.loads((Path(d) / "rank0.json").read_text())
    rows, setup_ms = doc["epochs"], doc["setup_ms"]
    ms = [r[1] for r in rows[1:]]  # the first exchange includes connection set-up
    size = statistics.median(r[0] for r in rows)
    result = {
        "ranks": 2,
        "bytes_per_rank": size,
        "exchange_ms_median": statistics.median(ms),
        "exchange_ms_max": max(ms),
        "bytes_into_rank0_at_1024_ranks": size * 1024,
        "per_step_collectives": 0,
        "setup_ms_once": setup_ms,
    }
    print(f"{'measure':44} {'value':>12}")
    print(f"{'summary pickled per rank per epoch (bytes)':44} {size:12,.0f}")
    print(f"{'exchange wall time, median (ms)':44} {result['exchange_ms_median']:12.2f}")
    print(f"{'exchange wall time, max (ms)':44} {result['exchange_ms_max']:12.2f}")
    print(f"{'into rank 0 per epoch at 1,024 ranks (MiB)':44} {size * 1024 / 2**20:12.2f}")
    print(f"{'collectives per step':44} {0:12d}")
    print(f"{'set-up once in start(): group + job id (ms)':44} {setup_ms:12.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rank_exchange.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
