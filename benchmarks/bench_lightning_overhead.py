"""Overhead of ``MemWatchCallback`` on a real ``Trainer.fit``, next to Lightning's own
``DeviceStatsMonitor``.

The same fit runs in three variants — no memory callback (baseline), ``MemWatchCallback()`` with
its defaults, and ``DeviceStatsMonitor(cpu_stats=True)`` — interleaved (each repeat runs every
variant once, in a rotated order) so that load from other processes hits all variants alike.
Every variant logs to a ``CSVLogger`` at the trainer's default cadence, as a user's run would.

Step time is the interval between consecutive ``on_train_batch_start`` calls (a timing callback
present in every variant), so it includes everything Lightning does per step: data, forward,
backward, optimizer, every callback and logging. The headline is the ratio of median step times
to the baseline's in the same repeat (median over repeats); the mean ratio, which also carries
epoch-end work (memwatch's verdicts), is reported next to it. Target: memwatch <= 1.01.

    python benchmarks/bench_lightning_overhead.py            # full run, about 1 min on 2 cores
    python benchmarks/bench_lightning_overhead.py --quick    # smoke run (the test suite's)
    python benchmarks/bench_lightning_overhead.py --accelerator gpu   # on a CUDA machine

Writes ``benchmarks/results/lightning_overhead.json`` (``lightning_overhead_gpu.json`` on a
GPU), or ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run directly, by run_all.py, or loaded by file path by the tests: the root makes `benchmarks`
# importable in all three.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import _common  # noqa: E402

DEFAULT_OUT = HERE / "results" / "lightning_overhead.json"
VARIANTS = ("baseline", "memwatch", "devicestats")
TARGET = 1.01


def _build(width: int, n_in: int) -> Any:
    import lightning.pytorch as L
    import torch
    import torch.nn.functional as F
    from torch import nn

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width),
                                     nn.ReLU(), nn.Linear(width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return MLP


class _StepTimer:
    """Timestamps of every ``on_train_batch_start``: intervals are whole steps."""

    def __init__(self) -> None:
        import lightning.pytorch as L

        class Timer(L.Callback):
            def __init__(self) -> None:
                self.stamps: list[float] = []
                self.cpu: list[float] = []  # this thread's CPU time: blind to other processes

            def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                     batch_idx: int) -> None:
                self.stamps.append(time.perf_counter())
                self.cpu.append(time.thread_time())

            def on_train_end(self, trainer: Any, pl_module: Any) -> None:
                self.stamps.append(time.perf_counter())
                self.cpu.append(time.thread_time())

        self.cb = Timer()


def _fit(variant: str, steps: int, epochs: int, width: int, n_in: int, batch: int,
         root: str, accelerator: str) -> dict[str, Any]:
    """One fit: wall and CPU step intervals (seconds, warm-up dropped), wall and process CPU."""
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.callbacks import DeviceStatsMonitor
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from memwatch.integrations.lightning import MemWatchCallback

    torch.manual_seed(0)
    per_epoch = max(steps // epochs, 1)
    n = per_epoch * batch
    data = DataLoader(TensorDataset(torch.randn(n, n_in), torch.randn(n, 1)), batch_size=batch)
    timer = _StepTimer().cb
    callbacks: list[Any] = [timer]
    hook_s: list[float] = []
    if variant == "memwatch":

        class TimedMemWatch(MemWatchCallback):
            """Times its own per-step hook: a noise-robust figure next to the step ratios."""

            def on_train_batch_end(self, *args: Any) -> None:
                t = time.perf_counter()
                super().on_train_batch_end(*args)
                hook_s.append(time.perf_counter() - t)

            def on_train_epoch_end(self, *args: Any) -> None:
                t = time.perf_counter()
                super().on_train_epoch_end(*args)
                _EPOCH_END_S.append(time.perf_counter() - t)

            def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
                t = time.perf_counter()
                super().setup(trainer, pl_module, stage)
                _SETUP_S.append(time.perf_counter() - t)

        callbacks.append(TimedMemWatch())
    elif variant == "devicestats":
        # On CPU it can only report CPU stats; on a GPU its default (allocator stats) is the
        # fair comparison with memwatch's per-step allocator counters.
        callbacks.append(DeviceStatsMonitor(cpu_stats=True if accelerator == "cpu" else None))
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, max_epochs=epochs, callbacks=callbacks,
        logger=CSVLogger(root, name=variant), default_root_dir=root,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.fit(_build(width, n_in)(), data)
    wall, proc = time.perf_counter() - t0, time.process_time() - c0
    s, c = timer.stamps, timer.cpu
    intervals = [b - a for a, b in zip(s, s[1:], strict=False)]
    cpu = [b - a for a, b in zip(c, c[1:], strict=False)]
    warm = min(5, len(intervals) // 4)  # first steps pay for lazy initialisation
    _HOOK_S.extend(hook_s[warm:])
    return {"wall": intervals[warm:], "cpu": cpu[warm:], "wall_s": wall, "process_cpu_s": proc}


_HOOK_S: list[float] = []  # every timed MemWatchCallback.on_train_batch_end of this run
_EPOCH_END_S: list[float] = []  # its on_train_epoch_end (end_epoch: verdicts, census)
_SETUP_S: list[float] = []  # its setup (MemWatch start: probes, sampler, recorder)


def run(repeats: int, steps: int, epochs: int, width: int, n_in: int, batch: int,
        threads: int, accelerator: str = "cpu") -> dict[str, Any]:
    import lightning
    import torch

    torch.set_num_threads(threads)
    _HOOK_S.clear()
    _EPOCH_END_S.clear()
    _SETUP_S.clear()
    # Lightning sets its loggers to INFO when imported; its per-fit banners are noise here.
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    per_repeat: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    pooled: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="memwatch-bench-pl-") as root:
        for r in range(repeats):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]  # rotate: no variant always goes first
            for v in order:
                got = _fit(v, steps, epochs, width, n_in, batch, os.path.join(root, str(r)),
                           accelerator)
                pooled[v].extend(got["wall"])
                per_repeat[v].append(_common.repeat_row(got))
            _common.print_repeat(r, repeats, per_repeat, VARIANTS)

    def ratios(field: str, v: str) -> list[float]:
        return [a[field] / b[field] for a, b in zip(per_repeat[v], per_repeat["baseline"],
                                                     strict=True)]

    result: dict[str, Any] = {
        "benchmark": "lightning_overhead",
        "what": "median step time of Trainer.fit relative to no memory callback, interleaved",
        "target_memwatch_ratio": TARGET,
        "config": {"accelerator": accelerator,
                   "device": (torch.cuda.get_device_name(0) if accelerator == "gpu"
                              else _common.cpu_name()),
                   "repeats": repeats, "steps_per_fit": steps, "epochs_per_fit": epochs,
                   "model": f"MLP {n_in}-{width}-{width}-1", "batch": batch,
                   "torch_threads": threads, "logger": "CSVLogger, log_every_n_steps=50"},
        "step_ms": {v: {"median": statistics.median(pooled[v]) * 1e3,
                        "mean": statistics.fmean(pooled[v]) * 1e3} for v in VARIANTS},
        "ratio_median": {v: statistics.median(ratios("median_s", v)) for v in VARIANTS[1:]},
        "ratio_mean": {v: statistics.median(ratios("mean_s", v)) for v in VARIANTS[1:]},
        "ratio_median_per_repeat": {v: ratios("median_s", v) for v in VARIANTS[1:]},
        # Best case against best case: the fastest repeat's median step of each variant. On a
        # machine shared with other jobs this is the steadiest estimate of intrinsic cost.
        "ratio_best": {v: min(x["median_s"] for x in per_repeat[v])
                       / min(x["median_s"] for x in per_repeat["baseline"])
                       for v in VARIANTS[1:]},
        # Ratios of CPU time: the training thread's per step (median), and the whole process's
        # per fit (includes memwatch's background sampler and its epoch-end verdicts). Other
        # processes on a shared machine inflate wall time far more than these.
        "ratio_thread_cpu_median": {v: statistics.median(ratios("cpu_median_s", v))
                                    for v in VARIANTS[1:]},
        "ratio_process_cpu": {v: statistics.median(ratios("process_cpu_s", v))
                              for v in VARIANTS[1:]},
        "versions": _common.versions(lightning=lightning.__version__),
        "host": _common.host(),
    }
    if _HOOK_S:
        result["memwatch_hook_us"] = _common.hook_summary_us(
            _HOOK_S, result["step_ms"]["baseline"]["median"])
    if _EPOCH_END_S:
        result["memwatch_epoch_end_ms"] = _common.median_max_ms(_EPOCH_END_S)
    if _SETUP_S:
        result["memwatch_setup_ms"] = {"median": statistics.median(_SETUP_S) * 1e3}
    result["memwatch_within_target"] = result["ratio_median"]["memwatch"] <= TARGET
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few, short fits")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per fit")
    ap.add_argument("--width", type=int, default=None, help="hidden width of the MLP")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: steadier timings on a shared machine)")
    ap.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (2 if quick else 15)
    steps = args.steps or (24 if quick else 120)
    gpu = args.accelerator == "gpu"
    width = args.width or (64 if quick else 4096 if gpu else 512)
    n_in, batch = (1024, 1024) if gpu else (256, 128)
    out = args.out or (DEFAULT_OUT.with_name("lightning_overhead_gpu.json") if gpu
                       else DEFAULT_OUT)
    warnings.filterwarnings("ignore", module="lightning")  # CPU-run advice, not ours to measure
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    res = run(repeats, steps, 2, width, n_in, batch, args.threads, args.accelerator)
    res["quick"] = quick
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)  # atomic: a reader never sees half a file
    print(f"\nmedian step time on {res['config']['device']} ({args.accelerator}): "
          f"baseline {res['step_ms']['baseline']['median']:.3f} ms "
          f"({res['config']['model']}, batch {res['config']['batch']}, "
          f"{res['config']['torch_threads']} thread(s))")
    for v in VARIANTS[1:]:
        print(f"  {v:12} median ratio {res['ratio_median'][v]:.4f}   "
              f"mean ratio (incl. epoch ends) {res['ratio_mean'][v]:.4f}   "
              f"thread-CPU median ratio {res['ratio_thread_cpu_median'][v]:.4f}   "
              f"process-CPU ratio {res['ratio_process_cpu'][v]:.4f}   "
              f"best-repeat ratio {res['ratio_best'][v]:.4f}")
    if "memwatch_hook_us" in res:
        h = res["memwatch_hook_us"]
        print(f"  MemWatchCallback.on_train_batch_end: median {h['median']:.1f} us, "
              f"p99 {h['p99']:.1f} us -> implied ratio {h['implied_ratio']:.5f}")
    if "memwatch_epoch_end_ms" in res:
        print(f"  MemWatchCallback per epoch end: median "
              f"{res['memwatch_epoch_end_ms']['median']:.1f} ms; setup "
              f"{res['memwatch_setup_ms']['median']:.1f} ms (once per fit)")
    print(f"memwatch target <= {TARGET}: "
          f"{'met' if res['memwatch_within_target'] else 'NOT met'}; wrote {out}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
