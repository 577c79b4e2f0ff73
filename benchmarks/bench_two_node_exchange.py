"""Cost of memwatch across two nodes: a 2-node x 2-process torchrun job (4 gloo ranks, CPU).

Each node runs in its own UTS namespace (``unshare --uts``, its own host name) with its own
torchrun agent, rendezvous c10d on the loopback address, as ``integrations/distributed/
test_two_nodes.py`` runs it; without the right to create a namespace (not root) both agents run
under this host's name, which changes nothing measured here. Every rank runs ``--epochs`` epoch
ends of ``--steps`` steps of a tiny data-parallel loop (gradients all-reduced by hand) under
``memwatch.watch()`` and records:

* the bytes of the summary it sends to rank 0 at each check (pickled; 184 B on one node before
  the summary named the node);
* the collectives ``mw.step()`` issued (every ``torch.distributed`` collective is counted around
  it: must be 0) and the collectives memwatch issued in all (one barrier and one gather per
  check, one broadcast at start);
* the check's cost with 4 ranks: ``end_epoch()``'s wall and CPU time on each rank (analysis, the
  exchange) and the exchange's own wall time (barrier + gather);
* the one-time set-up in ``start()``: memwatch's gloo group, the job id's broadcast and the
  failure board's store client; and one record and one read on the failure board (what a failing
  rank and each of its peers pay, once).

Prints a table and writes ``benchmarks/results/two_node_exchange.json`` (``--json`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
WORKER = r'''
import json, socket, sys, time
import torch, torch.distributed as dist
import memwatch
from memwatch.runtime import peers

out_dir, epochs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
counts = {}
for name in ("all_gather", "all_gather_object", "gather", "gather_object", "all_reduce",
             "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce",
             "scatter", "send", "recv"):
    fn = getattr(dist, name)
    def counted(*a, _fn=fn, _n=name, **k):
        counts[_n] = counts.get(_n, 0) + 1
        return _fn(*a, **k)
    setattr(dist, name, counted)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
in_step, checks = 0, []
with memwatch.watch(device="cpu", workers=False, out_dir=f"{out_dir}/r{rank}",
                    signals=False, census="never") as mw:
    for epoch in range(epochs):
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(torch.randn(32, 64)), torch.randn(32, 1))
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p.grad)  # the training's own collective (not memwatch's)
            opt.step()
            before = sum(counts.values())
            mw.step()
            in_step += sum(counts.values()) - before
        t0, c0 = time.perf_counter(), time.thread_time()
        mw.end_epoch()
        ex = mw._checker.exchange
        checks.append({"wall_ms": (time.perf_counter() - t0) * 1e3,
                       "cpu_ms": (time.thread_time() - c0) * 1e3,
                       "exchange_ms": ex.last_ms, "bytes": ex.last_bytes})
    ours = {k: v for k, v in counts.items() if k != "all_reduce"}  # all_reduce: the training's
    board = peers.current()
    t0 = time.perf_counter()
    if rank == 3 and board is not None:
        board.report("host_oom", {"rank": 1, "count": 2, "name": "x"}, time.time())
    t_report = time.perf_counter() - t0
    dist.barrier()
    t1 = time.perf_counter()
    first = board.first() if board is not None else None
    t2 = time.perf_counter()
    doc = {"rank": rank, "checks": checks, "setup_ms": ex.setup_ms, "in_step": in_step,
           "memwatch_collectives": ours,
           "board_report_ms": t_report * 1e3 if rank == 3 else None,
           "board_first_ms": (t2 - t1) * 1e3, "board_named": (first or {}).get("rank"),
           "host": socket.gethostname()}
    json.dump(doc, open(f"{out_dir}/rank{rank}.json", "w"))
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _namespaces() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


def run(epochs: int, steps: int) -> dict[str, Any]:
    uts = _namespaces()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "worker.py"
        script.write_text(WORKER)
        port = _free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        procs = []
        for n in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{port}", "--rdzv-id", "bench", "--local-addr", "127.0.0.1",
                   str(script), d, str(epochs), str(steps)]
            if uts:
                cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                       f"node{n}", *cmd]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        for p in procs:
            log = p.communicate(timeout=600)[0]
            if p.returncode != 0:
                raise SystemExit(f"torchrun failed:\n{log[-3000:]}")
        ranks = [json.loads((Path(d) / f"rank{r}.json").read_text()) for r in range(4)]
    checks = [c for r in ranks for c in r["checks"][1:]]  # the first includes connecting
    return {
        "nodes": 2, "ranks": 4, "uts_namespaces": uts, "epochs": epochs, "steps": steps,
        "hosts": sorted({r["host"] for r in ranks}),
        "bytes_per_rank_per_check": statistics.median(c["bytes"] for c in checks),
        "collectives_per_step": sum(r["in_step"] for r in ranks),
        "memwatch_collectives_rank0": ranks[0]["memwatch_collectives"],
        "check_wall_ms_median": statistics.median(c["wall_ms"] for c in checks),
        "check_wall_ms_max": max(c["wall_ms"] for c in checks),
        "check_cpu_ms_median": statistics.median(c["cpu_ms"] for c in checks),
        "exchange_ms_median": statistics.median(c["exchange_ms"] for c in checks),
        "exchange_ms_max": max(c["exchange_ms"] for c in checks),
        "setup_ms_median": statistics.median(r["setup_ms"] for r in ranks),
        "board_report_ms": ranks[3]["board_report_ms"],
        "board_first_ms_median": statistics.median(r["board_first_ms"] for r in ranks),
        "board_named_rank": ranks[0]["board_named"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", type=Path, default=RESULTS / "two_node_exchange.json")
    a = ap.parse_args()
    r = run(a.epochs, a.steps)
    rows = [
        ("nodes x processes (hosts)", f"2 x 2 ({', '.join(r['hosts'])})"),
        ("summary per rank per check (bytes)", f"{r['bytes_per_rank_per_check']:,.0f}"),
        ("collectives issued by mw.step(), all ranks", str(r["collectives_per_step"])),
        ("memwatch's collectives on rank 0 in all", json.dumps(r["memwatch_collectives_rank0"])),
        ("check (end_epoch) wall, median / max (ms)",
         f"{r['check_wall_ms_median']:.1f} / {r['check_wall_ms_max']:.1f}"),
        ("check (end_epoch) CPU, median (ms)", f"{r['check_cpu_ms_median']:.1f}"),
        ("exchange wall (barrier + gather), median / max (ms)",
         f"{r['exchange_ms_median']:.1f} / {r['exchange_ms_max']:.1f}"),
        ("set-up once in start(): group, job id, board (ms)", f"{r['setup_ms_median']:.1f}"),
        ("failure board: one record (ms)", f"{r['board_report_ms']:.2f}"),
        ("failure board: one read, median (ms)", f"{r['board_first_ms_median']:.2f}"),
    ]
    w = max(len(k) for k, _ in rows)
    print(f"{'measure':{w}}  value")
    for k, v in rows:
        print(f"{k:{w}}  {v}")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
