"""Overhead of ``memwatch.integrations.accelerate.attach`` on a real custom Accelerate loop.

Two identical MLPs train on the same Accelerator and the same batches; memwatch is attached, at
its defaults, to one of them (per-step host sample from its optimizer's post-hook, epoch ends
from the DataLoader, verdicts). Each batch steps both, in alternating order, and each step
(forward, backward, optimizer step with its hooks, zero_grad) is timed on its own: interleaving
step by step keeps the load of other processes, which drifts over seconds on a shared machine,
out of the comparison.

The headline is the ratio of median step times (watched / baseline in the same run), median over
repeats; target <= 1.01. Next to it: the same ratio in thread CPU time, the mean ratio (which
also charges the epoch-end verdicts to the watched model), the epoch-end time, and the hook's own
cost per call, timed where it runs (between two other post-hooks on the same optimizer, right
after a backward pass) and warm in a tight loop: both robust to the load of other processes.

    python benchmarks/bench_accelerate_overhead.py            # full run, about 1 min on 2 cores
    python benchmarks/bench_accelerate_overhead.py --quick    # smoke run (the test suite's)

Writes ``benchmarks/results/accelerate_overhead.json`` (or ``--out``).
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run directly, by run_all.py, or loaded by file path by the tests: the root makes `benchmarks`
# importable in all three.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import _common  # noqa: E402

DEFAULT_OUT = HERE / "results" / "accelerate_overhead.json"
VARIANTS = ("baseline", "memwatch")
TARGET = 1.01


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _run(steps: int, epochs: int, width: int, n_in: int, batch: int, root: str,
         first: str) -> dict[str, Any]:
    """One run with two identical models on one Accelerator and one prepared DataLoader: each
    batch trains the baseline model and the watched one (the only optimizer memwatch hooks), in
    alternating order, each step timed on its own. Pairing the variants step by step keeps the
    load of other processes, which drifts over seconds, out of the comparison."""
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from memwatch.integrations.accelerate import attach

    _reset_accelerate()
    torch.manual_seed(0)
    per_epoch = max(steps // epochs, 1)
    n = per_epoch * batch
    data = DataLoader(TensorDataset(torch.randn(n, n_in), torch.randn(n, 1)), batch_size=batch)

    def mlp() -> Any:
        torch.manual_seed(1)  # identical weights: identical work
        return nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width),
                             nn.ReLU(), nn.Linear(width, 1))

    accelerator = Accelerator(cpu=True)
    models = {"baseline": mlp(), "memwatch": mlp()}
    opts = {v: torch.optim.SGD(m.parameters(), lr=1e-3) for v, m in models.items()}
    models["baseline"], models["memwatch"], opts["baseline"], opts["memwatch"], data = \
        accelerator.prepare(models["baseline"], models["memwatch"], opts["baseline"],
                            opts["memwatch"], data)
    # memwatch's post-hook timed where it runs (right after a backward pass, caches cold):
    # step post-hooks run in registration order, so one registered before attach() and one
    # after bracket it.
    inner = opts["memwatch"].optimizer
    bracket: list[tuple[float, float]] = []
    in_situ: list[float] = []
    in_situ_cpu: list[float] = []  # the same calls in thread CPU time (what load cannot move)

    def closed(*_: object) -> None:
        t, c = bracket[-1]
        in_situ.append(time.perf_counter() - t)
        in_situ_cpu.append(time.thread_time() - c)

    before = inner.register_step_post_hook(
        lambda *_: bracket.append((time.perf_counter(), time.thread_time())))
    hook = attach(accelerator, opts["memwatch"], out_dir=os.path.join(root, "memwatch"))
    after = inner.register_step_post_hook(closed)
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    epoch_end_s: list[float] = []
    order = [first, *[v for v in VARIANTS if v != first]]
    for _ in range(epochs):
        it = iter(data)
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                # The exhausting next() runs the loader's end(): memwatch's epoch end.
                epoch_end_s.append(time.perf_counter() - t)
                break
            for v in order:
                t0, c0 = time.perf_counter(), time.thread_time()
                accelerator.backward(F.mse_loss(models[v](x), y))
                opts[v].step()
                opts[v].zero_grad()
                wall[v].append(time.perf_counter() - t0)
                cpu[v].append(time.thread_time() - c0)
            order.reverse()
    steps_seen = hook.memwatch.step_count
    hook.detach()
    before.remove()
    after.remove()
    warm = min(5, len(wall["baseline"]) // 4)  # the first steps pay for lazy initialisation
    return {"wall": {v: w[warm:] for v, w in wall.items()},
            "cpu": {v: c[warm:] for v, c in cpu.items()},
            "epoch_end_s": epoch_end_s, "memwatch_steps": steps_seen,
            "hook_in_situ_s": in_situ[warm:], "hook_in_situ_cpu_s": in_situ_cpu[warm:]}


def _hook_cost_us(calls: int, root: str) -> dict[str, float]:
    """The post-hook's own cost per call, timed directly on a real hook (no training around)."""
    import torch
    from accelerate import Accelerator

    from memwatch.integrations.accelerate import attach

    _reset_accelerate()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1e-3))
    hook = attach(accelerator, opt, out_dir=os.path.join(root, "hookcost"), epochs="manual",
                  capacity=max(calls * 2, 1024))
    inner = opt.optimizer
    per_call: list[float] = []
    per_call_cpu: list[float] = []
    for _ in range(calls):
        t, c = time.perf_counter(), time.thread_time()
        hook._on_optimizer_step(inner, (), {})
        per_call.append(time.perf_counter() - t)
        per_call_cpu.append(time.thread_time() - c)
    hook.detach()
    return {**_common.median_p90_us(per_call),
            "thread_cpu_median": statistics.median(per_call_cpu) * 1e6}


def run(repeats: int, steps: int, epochs: int, width: int, n_in: int, batch: int,
        threads: int, quick: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratio_median: list[float] = []
    ratio_mean: list[float] = []
    ratio_cpu: list[float] = []
    epoch_end: list[float] = []
    in_situ: list[float] = []
    in_situ_cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="memwatch-bench-acc-") as root:
        for r in range(repeats):
            got = _run(steps, epochs, width, n_in, batch, root, VARIANTS[r % 2])
            if got["memwatch_steps"] != steps // epochs * epochs:
                raise RuntimeError(f"memwatch sampled {got['memwatch_steps']} steps")
            med = {v: statistics.median(got["wall"][v]) for v in VARIANTS}
            for v in VARIANTS:
                per[v].append(med[v])
            ratio_median.append(med["memwatch"] / med["baseline"])
            # The mean carries the epoch ends (verdicts) too, charged to the watched model.
            total_mw = sum(got["wall"]["memwatch"]) + sum(got["epoch_end_s"])
            ratio_mean.append(total_mw / sum(got["wall"]["baseline"]))
            ratio_cpu.append(statistics.median(got["cpu"]["memwatch"])
                             / statistics.median(got["cpu"]["baseline"]))
            epoch_end.extend(got["epoch_end_s"])
            in_situ.extend(got["hook_in_situ_s"])
            in_situ_cpu.extend(got["hook_in_situ_cpu_s"])
        hook_us = _hook_cost_us(200 if quick else 2000, root)
    base_ms = statistics.median(per["baseline"]) * 1e3
    result: dict[str, Any] = {
        "benchmark": "accelerate_overhead",
        "quick": quick,
        "target_memwatch_ratio": TARGET,
        "config": {"repeats": repeats, "steps": steps, "epochs": epochs, "width": width,
                   "n_in": n_in, "batch": batch, "threads": threads},
        "machine": _common.platform_info(),
        "step_ms": {v: {"median": statistics.median(per[v]) * 1e3,
                        "per_repeat": [x * 1e3 for x in per[v]]} for v in VARIANTS},
        "ratio_median": statistics.median(ratio_median),
        "ratio_median_per_repeat": ratio_median,
        "ratio_mean": statistics.median(ratio_mean),
        "ratio_thread_cpu_median": statistics.median(ratio_cpu),
        "load_avg_1min": _common.load_avg_1min(),
        "memwatch_hook_us": hook_us,
        "memwatch_hook_us_in_situ": {**_common.median_p90_us(in_situ),
                                     "thread_cpu_median": statistics.median(in_situ_cpu) * 1e6},
        "memwatch_hook_fraction_of_step": statistics.median(in_situ) * 1e3 / base_ms,
        "memwatch_epoch_end_ms": _common.median_max_ms(epoch_end),
    }
    result["memwatch_within_target"] = result["ratio_median"] <= TARGET
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few, short runs")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 keeps a shared machine's noise down)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 9)
    steps = args.steps or (60 if args.quick else 300)
    res = run(repeats, steps, args.epochs, args.width, 64, args.batch, args.threads, args.quick)
    out: Path = args.out or DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)
    print(f"baseline step {res['step_ms']['baseline']['median']:.3f} ms; memwatch/baseline "
          f"median-step ratio {res['ratio_median']:.4f} (target <= {TARGET}), mean ratio "
          f"{res['ratio_mean']:.4f}, thread-CPU ratio {res['ratio_thread_cpu_median']:.4f}; "
          f"hook {res['memwatch_hook_us_in_situ']['median']:.1f} us/call in the loop, "
          f"{res['memwatch_hook_us']['median']:.1f} us warm "
          f"({100 * res['memwatch_hook_fraction_of_step']:.2f}% of a step); epoch end "
          f"{res['memwatch_epoch_end_ms']['median']:.1f} ms -> {out}")
    return res


if __name__ == "__main__":
    main()
