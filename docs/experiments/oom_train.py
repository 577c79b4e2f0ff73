"""A tiny CPU training loop meant to be OOM-killed by the kernel; reports what the main process saw.

Run it inside a memory-limited cgroup (``oom_driver.py`` does):

    python oom_train.py MODE OUT_JSON CGROUP_DIR [--sleep-item S] [--max-seconds T]

``--loader-thread`` iterates the loader in a prefetching thread (so torch installs no SIGCHLD
handler: it does so only from the main thread). ``--compute N`` adds N 1024x1024 matmuls per
step, so the main process is busy computing (batches wait prefetched in the queue) rather than
waiting for data.

MODE ``worker``: each DataLoader worker (``num_workers=2``, ``persistent_workers=True``) keeps
4 MiB per item it loads, so the workers grow until the kernel kills one. MODE ``main``: the
workers keep nothing, the main process keeps 4 MiB per optimizer step.

The report (JSON) holds every exception the loop saw with its whole ``__cause__``/``__context__``
chain and the frames each came through, the worker pids, and timestamps (``time.monotonic()``,
which on Linux is the clock of ``/dev/kmsg`` records to within ~1 ms, checked by the driver):

- ``t_oom_counter``: when a 1 ms poller thread saw the cgroup's ``oom_kill`` counter rise;
- ``sigchld``: when each SIGCHLD reached the process (C-level, via ``signal.set_wakeup_fd``, so
  also when the DataLoader's Python SIGCHLD handler raises and never calls the next handler);
- ``t_exception``: when the ``except`` around the loop ran; ``shutdown_s``: how long deleting
  the loader (joining the workers) took afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MIB = 1 << 20
_hoard: list[bytes] = []  # per process: a forked worker gets its own (empty) copy


class Growing(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, grow: bool, sleep_item: float) -> None:
        self.n, self.grow, self.sleep_item = n, grow, sleep_item

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.grow:
            _hoard.append(b"\x01" * (4 * MIB))  # touched: charged to the cgroup
        time.sleep(self.sleep_item)
        return torch.randn(256), torch.tensor(i % 10)


class _ThreadedLoader:
    """Iterates a DataLoader in a daemon thread, two batches ahead; re-raises its exception."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        import queue

        self._q: queue.Queue[Any] = queue.Queue(maxsize=2)
        ready = threading.Event()
        self.worker_pids: list[int] = []

        def run() -> None:
            try:
                it = iter(loader)
                self.worker_pids.extend(p.pid for p in it._workers)  # type: ignore[attr-defined]
                ready.set()
                for batch in it:
                    self._q.put(("batch", batch))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                ready.set()
                self._q.put(("error", e))

        threading.Thread(target=run, daemon=True, name="loader").start()
        ready.wait()

    def __next__(self) -> Any:
        kind, item = self._q.get()
        if kind == "error":
            raise item
        return item


def _chain(exc: BaseException) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    relation = "raised"
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        frames = traceback.extract_tb(e.__traceback__)
        out.append(
            {
                "relation": relation,
                "type": f"{type(e).__module__}.{type(e).__qualname__}",
                "message": str(e),
                "suppress_context": e.__suppress_context__,
                "frames": [f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in frames],
            }
        )
        if e.__cause__ is not None:
            e, relation = e.__cause__, "cause"
        elif e.__context__ is not None:
            e, relation = e.__context__, "context"
        else:
            e = None
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "main"])
    ap.add_argument("out")
    ap.add_argument("cgroup_dir")
    ap.add_argument("--sleep-item", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--compute", type=int, default=0, help="extra 1024x1024 matmuls per step")
    ap.add_argument("--loader-thread", action="store_true", help="iterate in a background thread")
    a = ap.parse_args()

    rep: dict[str, Any] = {"pid": os.getpid(), "mode": a.mode, "t_start": time.monotonic()}
    events_file = (
        "memory.oom_control"
        if os.path.exists(os.path.join(a.cgroup_dir, "memory.oom_control"))
        else "memory.events"
    )
    fd = os.open(os.path.join(a.cgroup_dir, events_file), os.O_RDONLY)

    def oom_kills() -> int:
        for line in os.pread(fd, 4096, 0).decode().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return -1

    workers: list[int] = []
    rep["worker_pids"] = workers
    rep["sigchld"] = []
    rep["oom_counter_changes"] = []
    stop = threading.Event()

    def poll_counter() -> None:
        last = oom_kills()
        rep["oom_kills_at_start"] = last
        while not stop.is_set():
            v = oom_kills()
            if v != last:
                t = time.monotonic()
                rep["oom_counter_changes"].append(
                    {"t": t, "value": v, "worker_states": {p: _state(p) for p in workers}}
                )
                rep.setdefault("t_oom_counter", t)
                last = v
            time.sleep(0.001)

    # SIGCHLD arrival, timed where the C-level handler runs: torch's Python handler may raise
    # before it calls the previous handler, so a Python handler of ours would not see it.
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGCHLD, lambda s, f: None)  # a C handler must exist to write the fd
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch_signals() -> None:
        while True:
            b = os.read(r, 64)
            if not b:
                return
            t = time.monotonic()
            for s in b:
                if s == signal.SIGCHLD:
                    states = {p: _state(p) for p in workers}
                    rep["sigchld"].append({"t": t, "worker_states": states})
                if s == 0:
                    return

    threading.Thread(target=poll_counter, daemon=True).start()
    threading.Thread(target=watch_signals, daemon=True).start()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(
        Growing(10**6, grow=a.mode == "worker", sleep_item=a.sleep_item),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
    )
    big = torch.randn(1024, 1024) / 32
    step = 0
    where = "setup"
    rep["steps"] = 0
    deadline = time.monotonic() + a.max_seconds
    try:
        if a.loader_thread:
            # A prefetching thread iterates the loader: torch installs its SIGCHLD handler only
            # from the main thread, so here none is installed.
            it = _ThreadedLoader(loader)
            workers.extend(it.worker_pids)
        else:
            it = iter(loader)
            workers.extend(p.pid for p in it._workers)  # type: ignore[attr-defined]
        rep["sigchld_handler"] = repr(signal.getsignal(signal.SIGCHLD))
        while time.monotonic() < deadline:
            where = "next(loader)"
            x, y = next(it)
            where = "forward/backward"
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            where = "optimizer.step"
            opt.step()
            if a.compute:
                where = "extra compute"
                for _ in range(a.compute):
                    big = torch.mm(big, big).clamp_(-1, 1)
            if a.mode == "main":
                where = "main hoards 4 MiB"
                _hoard.append(b"\x01" * (4 * MIB))
            step += 1
            rep["steps"] = step
        rep["outcome"] = "deadline reached without a kill"
    except BaseException as e:  # noqa: BLE001 - recording exactly what arrives
        rep["t_exception"] = time.monotonic()
        rep["outcome"] = "exception"
        rep["where"] = where
        rep["chain"] = _chain(e)
        rep["traceback"] = "".join(traceback.format_exception(e))
    rep["worker_states_after"] = {p: _state(p) for p in workers}
    t = time.monotonic()
    try:
        del it
    except NameError:
        pass
    del loader
    rep["shutdown_s"] = time.monotonic() - t
    stop.set()
    rep["t_end"] = time.monotonic()
    signal.set_wakeup_fd(-1)
    with open(a.out + ".tmp", "w") as f:
        json.dump(rep, f, indent=1)
    os.replace(a.out + ".tmp", a.out)
    sys.exit(3 if rep["outcome"] == "exception" else 0)


if __name__ == "__main__":
    main()
