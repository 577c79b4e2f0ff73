"""Overhead of ``memwatch.integrations.transformers.MemWatchCallback`` on a real ``Trainer.train``.

The same training runs with no memory callback (baseline) and with ``MemWatchCallback()`` at its
defaults, interleaved (each repeat runs both, in alternating order) so that load from other
processes hits both alike. The model is a small BERT built from a config (nothing downloaded), on
CPU, with the trainer logging every ``logging_steps=10`` steps (memwatch adds its keys to those
rows) and ``report_to=[]``.

Step time is the interval between consecutive ``on_step_begin`` calls of a timing callback present
in both variants, so it includes everything the trainer does per optimizer step: data, forward,
backward, optimizer, every callback, logging. Each repeat gives the ratio of median step times
(memwatch / baseline). On a shared machine the variant that runs second in a repeat was measured
~5% faster whichever it is, so repeats come in pairs with both orders and the headline is the
median over pairs of the pair's geometric-mean ratio (the position bias cancels). Target:
memwatch <= 1.01. The callback's own ``on_step_end`` is timed too, in wall and thread-CPU time
(figures the machine's noise barely touches).

    python benchmarks/bench_transformers_overhead.py           # full run, a few minutes on 2 cores
    python benchmarks/bench_transformers_overhead.py --quick   # smoke run (the test suite's)

Writes ``benchmarks/results/transformers_overhead.json``, or ``--out``.
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

DEFAULT_OUT = HERE / "results" / "transformers_overhead.json"
VARIANTS = ("baseline", "memwatch")
TARGET = 1.01

_HOOK_S: list[float] = []  # every timed MemWatchCallback.on_step_end
_HOOK_CPU_S: list[float] = []  # the same, in this thread's CPU time (blind to preemption)
_EPOCH_END_S: list[float] = []  # its on_epoch_end (verdicts, census)
_BEGIN_S: list[float] = []  # its on_train_begin (MemWatch start: probes, sampler, recorder)


def _train(variant: str, steps: int, epochs: int, hidden: int, seq: int, batch: int,
           root: str) -> dict[str, Any]:
    import torch
    from torch.utils.data import TensorDataset
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from memwatch.integrations.transformers import MemWatchCallback

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.stamps: list[float] = []
            self.cpu: list[float] = []  # this thread's CPU time: blind to other processes

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.stamps.append(time.perf_counter())
            self.cpu.append(time.thread_time())

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.stamps.append(time.perf_counter())
            self.cpu.append(time.thread_time())

    class TimedMemWatch(MemWatchCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            t, c = time.perf_counter(), time.thread_time()
            super().on_step_end(args, state, control, **kw)
            _HOOK_S.append(time.perf_counter() - t)
            _HOOK_CPU_S.append(time.thread_time() - c)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            t = time.perf_counter()
            super().on_epoch_end(args, state, control, **kw)
            _EPOCH_END_S.append(time.perf_counter() - t)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            t = time.perf_counter()
            super().on_train_begin(args, state, control, **kw)
            _BEGIN_S.append(time.perf_counter() - t)

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=2 * hidden, vocab_size=1000, max_position_embeddings=seq)
    per_epoch = max(steps // epochs, 1)
    n = per_epoch * batch
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (n, seq), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)

    def collate(rows: list[tuple[Any, Any]]) -> dict[str, Any]:
        return {"input_ids": torch.stack([r[0] for r in rows]),
                "labels": torch.stack([r[1] for r in rows])}

    args = TrainingArguments(
        output_dir=os.path.join(root, variant), use_cpu=True, per_device_train_batch_size=batch,
        num_train_epochs=epochs, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=10, seed=0, dataloader_num_workers=0,
    )
    timer = Timer()
    callbacks: list[Any] = [timer]
    if variant == "memwatch":
        callbacks.insert(0, TimedMemWatch())
    trainer = Trainer(BertForSequenceClassification(cfg), args,
                      train_dataset=TensorDataset(ids, labels), data_collator=collate,
                      callbacks=callbacks)
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    wall, proc = time.perf_counter() - t0, time.process_time() - c0
    s, c = timer.stamps, timer.cpu
    intervals = [b - a for a, b in zip(s, s[1:], strict=False)]
    cpu = [b - a for a, b in zip(c, c[1:], strict=False)]
    warm = min(5, len(intervals) // 4)  # first steps pay for lazy initialisation
    return {"wall": intervals[warm:], "cpu": cpu[warm:], "wall_s": wall, "process_cpu_s": proc}


def _pair_balanced(ratios: list[float]) -> list[float]:
    """Geometric mean of each (baseline first, memwatch first) pair of repeats."""
    pairs = [(ratios[i] * ratios[i + 1]) ** 0.5 for i in range(0, len(ratios) - 1, 2)]
    return pairs or ratios


def run(repeats: int, steps: int, epochs: int, hidden: int, seq: int, batch: int,
        threads: int) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_num_threads(threads)
    for lst in (_HOOK_S, _HOOK_CPU_S, _EPOCH_END_S, _BEGIN_S):
        lst.clear()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    per_repeat: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    pooled: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="memwatch-bench-hf-") as root:
        for r in range(repeats):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]  # no variant always goes first
            for v in order:
                got = _train(v, steps, epochs, hidden, seq, batch, os.path.join(root, str(r)))
                pooled[v].extend(got["wall"])
                per_repeat[v].append(_common.repeat_row(got))
            _common.print_repeat(r, repeats, per_repeat, VARIANTS)

    def ratios(field: str) -> list[float]:
        return [a[field] / b[field] for a, b in zip(per_repeat["memwatch"],
                                                     per_repeat["baseline"], strict=True)]

    result: dict[str, Any] = {
        "benchmark": "transformers_overhead",
        "what": "median step time of Trainer.train relative to no memory callback, interleaved",
        "target_memwatch_ratio": TARGET,
        "config": {"device": _common.cpu_name(), "repeats": repeats,
                   "steps_per_run": steps, "epochs_per_run": epochs,
                   "model": f"BERT 2 layers, hidden {hidden}, seq {seq}", "batch": batch,
                   "torch_threads": threads, "logging_steps": 10, "report_to": []},
        "step_ms": {v: {"median": statistics.median(pooled[v]) * 1e3,
                        "mean": statistics.fmean(pooled[v]) * 1e3} for v in VARIANTS},
        "ratio_median": statistics.median(_pair_balanced(ratios("median_s"))),
        "ratio_median_unpaired": statistics.median(ratios("median_s")),
        "ratio_mean": statistics.median(ratios("mean_s")),
        "ratio_median_per_repeat": ratios("median_s"),
        "ratio_best": (min(x["median_s"] for x in per_repeat["memwatch"])
                       / min(x["median_s"] for x in per_repeat["baseline"])),
        "ratio_thread_cpu_median": statistics.median(ratios("cpu_median_s")),
        "ratio_process_cpu": statistics.median(ratios("process_cpu_s")),
        "versions": _common.versions(transformers=transformers.__version__),
        "host": _common.host(),
    }
    if _HOOK_S:
        result["memwatch_hook_us"] = _common.hook_summary_us(
            _HOOK_S, result["step_ms"]["baseline"]["median"], thread_cpu_s=_HOOK_CPU_S)
    if _EPOCH_END_S:
        result["memwatch_epoch_end_ms"] = _common.median_max_ms(_EPOCH_END_S)
    if _BEGIN_S:
        result["memwatch_train_begin_ms"] = {"median": statistics.median(_BEGIN_S) * 1e3}
    result["memwatch_within_target"] = result["ratio_median"] <= TARGET
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few, short runs")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: steadier timings on a shared machine)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (2 if quick else 10)
    steps = args.steps or (16 if quick else 100)
    hidden, seq, batch = (32, 32, 8) if quick else (64, 64, 8)
    out = args.out or DEFAULT_OUT
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", module="transformers")
    res = run(repeats, steps, 2, hidden, seq, batch, args.threads)
    res["quick"] = quick
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)  # atomic: a reader never sees half a file
    print(f"\nmedian step time: baseline {res['step_ms']['baseline']['median']:.3f} ms "
          f"({res['config']['model']}, batch {batch}, {args.threads} thread(s))")
    print(f"  memwatch median step-time ratio {res['ratio_median']:.4f} (order-balanced pairs; "
          f"unpaired {res['ratio_median_unpaired']:.4f})   "
          f"mean ratio (incl. epoch ends) {res['ratio_mean']:.4f}   "
          f"thread-CPU median ratio {res['ratio_thread_cpu_median']:.4f}   "
          f"best-repeat ratio {res['ratio_best']:.4f}")
    if "memwatch_hook_us" in res:
        h = res["memwatch_hook_us"]
        print(f"  MemWatchCallback.on_step_end: median {h['median']:.1f} us "
              f"({h['thread_cpu_median']:.1f} us of CPU), p99 {h['p99']:.1f} us -> implied "
              f"ratio {h['implied_ratio']:.5f}")
    if "memwatch_epoch_end_ms" in res:
        print(f"  per epoch end: median {res['memwatch_epoch_end_ms']['median']:.1f} ms; "
              f"on_train_begin {res['memwatch_train_begin_ms']['median']:.1f} ms (once per run)")
    print(f"memwatch target <= {TARGET}: "
          f"{'met' if res['memwatch_within_target'] else 'NOT met'}; wrote {out}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
