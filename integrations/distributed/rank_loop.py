"""A plain torch.distributed (gloo, CPU) training loop under memwatch.watch(), one planted problem
per mode. Launched by test_distributed.py with torchrun or as hand-started ranks.

    python rank_loop.py MODE OUT_DIR     (MODE: rank1_leaks | rank1_ooms)

Every torch.distributed collective is counted in every mode: step() must issue none. (A job
launched by torchrun whose rank dies of a host OOM, its peers' collectives failing, is
test_two_nodes.py's, with job_loop.py.)
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import memwatch

keep: list[torch.Tensor] = []  # rank 1's leak lives here
EPOCHS = 4  # a leak is due by the end of the second epoch after it starts


def main() -> None:
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    counts: dict[str, int] = {}
    # Count every collective memwatch could issue; step() must issue none.
    for name in ("all_gather", "all_gather_object", "gather", "gather_object", "all_reduce",
                 "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
                 "reduce", "scatter", "send", "recv"):
        fn = getattr(dist, name)

        def counted(*a: Any, _fn: Any = fn, _n: str = name, **k: Any) -> Any:
            counts[_n] = counts.get(_n, 0) + 1
            return _fn(*a, **k)

        setattr(dist, name, counted)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ooms = mode == "rank1_ooms"
    timeout = 5.0 if ooms else 60.0
    report: dict[str, Any] = {"rank": rank, "epochs": [], "end_epoch_s": []}
    with memwatch.watch(device="cpu", workers=False, out_dir=str(out_dir / f"rank{rank}"),
                        exchange_timeout_s=timeout, signals=False) as mw:
        for epoch in range(EPOCHS):
            for _ in range(80):
                loss = torch.nn.functional.mse_loss(model(torch.randn(32, 64)), torch.randn(32, 1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if rank == 1 and (ooms or mode == "rank1_leaks"):
                    keep.append(torch.randn(32, 512))  # 64 KiB per step, held forever
                if rank == 1 and ooms and epoch == 1:
                    if not keep or len(keep) == 81:
                        # Cap the address space a little above what is mapped now: the leak
                        # then dies of a real host OOM a few steps later.
                        vm = vmsize()
                        resource.setrlimit(resource.RLIMIT_AS, (vm + (48 << 20),) * 2)
                    keep.append(torch.ones(1 << 20))  # 4 MiB more per step until it fails
                before = dict(counts)
                mw.step()
                if counts != before:
                    report["collectives_in_step"] = counts
            t0 = time.perf_counter()
            fs = mw.end_epoch()
            report["end_epoch_s"].append(time.perf_counter() - t0)
            report["epochs"].append([f.to_dict() for f in fs])
        report["rank_summaries"] = mw.rank_summaries
        report["rank_last_seen"] = mw.rank_last_seen
        ex = mw._checker.exchange
        report["exchange"] = None if ex is None else {
            "bytes": ex.last_bytes, "ms": ex.last_ms, "exchanges": ex.exchanges,
            "missing": ex.missing}
        report["collectives_total"] = counts
    (out_dir / f"report-rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def vmsize() -> int:
    """This process's mapped address space (VmSize), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


if __name__ == "__main__":
    main()
