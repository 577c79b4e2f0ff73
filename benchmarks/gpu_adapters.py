"""The adapters on a real device (issue 18, 2c and 2d for Lightning, the HF Trainer and
Accelerate): the step-time ratio with and without memwatch on a GPT-2 built from a config in
bf16, and a real out-of-memory error inside ``fit`` / ``train()`` / an Accelerate loop that must
leave one bundle (captured before unwind on CUDA, with the allocator snapshot and the census).

``python benchmarks/gpu_adapters.py KIND FRAMEWORK DEVICE OUT_JSON OUT_DIR`` with KIND ``ratio``
or ``oom``, FRAMEWORK ``lightning``, ``transformers`` or ``accelerate``, DEVICE ``cuda`` or
``cpu``. ``gpu_check.py`` runs the CUDA ones, each in a child process of its own; on ``cpu`` the
same code runs small (fp32, a few steps; the OOM is the host allocator refusing 1 PiB), which
``tests/test_gpu_check.py`` runs on every ``make test`` so that the script works the day a GPU is
lent. Nothing here imports wandb or plotly.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_common import (  # noqa: E402
    EXPANDABLE,
    SIZES,
    Blocks,
    Ids,
    SyncCounter,
    gpt2,
    ratio_summary,
    spawn,
    write_result,
)

FRAMEWORKS = ("lightning", "transformers", "accelerate")
OOM_AT = 3  # the optimizer step (0-based) whose forward asks for more than the device has
SYNC_STEPS = 15  # the steps of the run whose synchronisations are counted


def too_much(device: Any) -> int:
    """Bytes no allocation on ``device`` can get: twice a CUDA device's memory, or 1 PiB of host
    memory (the kernel refuses the mapping; nothing is touched)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return 2 * int(torch.cuda.get_device_properties(dev).total_memory)
    return 1 << 50


def _oom_now(device: Any) -> None:
    import torch

    torch.empty(too_much(device), dtype=torch.uint8, device=device)


# --------------------------------------------------------------------------- one run each

def _lightning(device: str, sz: dict[str, int], mw: bool, out: Path, oom: bool,
               stamp: Blocks) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from memwatch.integrations.lightning import MemWatchCallback

    class LitGPT(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2(sz)

        def training_step(self, batch: Any, i: int) -> Any:
            if oom and self.global_step == OOM_AT:
                _oom_now(self.device)
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Stamp(pl.Callback):
        def on_train_batch_end(self, *a: Any, **k: Any) -> None:
            stamp()

    cb = MemWatchCallback(workers=False, out_dir=str(out)) if mw else None
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1,
        precision="bf16-true" if device == "cuda" else "32-true", max_steps=sz["steps"],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(out),
        callbacks=[c for c in (cb, Stamp()) if c is not None])
    data = DataLoader(Ids(sz["steps"] * sz["batch"], sz["seq"], sz["vocab"]),
                      batch_size=sz["batch"])
    trainer.fit(LitGPT(), data)
    return cb


def _transformers(device: str, sz: dict[str, int], mw: bool, out: Path, oom: bool,
                  stamp: Blocks) -> Any:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from memwatch.integrations.transformers import watch_trainer

    class OomTrainer(Trainer):
        def compute_loss(self, model: Any, inputs: Any, *a: Any, **k: Any) -> Any:
            if oom and self.state.global_step == OOM_AT:
                _oom_now(model.device)
            return super().compute_loss(model, inputs, *a, **k)

    class Stamp(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamp()

    def collate(rows: list[Any]) -> dict[str, Any]:
        import torch

        ids = torch.stack(rows)
        return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(
        output_dir=str(out / "hf"), max_steps=sz["steps"],
        per_device_train_batch_size=sz["batch"], use_cpu=device == "cpu",
        bf16=device == "cuda", report_to=[], save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = OomTrainer(gpt2(sz), args,
                         train_dataset=Ids(sz["steps"] * sz["batch"], sz["seq"], sz["vocab"]),
                         data_collator=collate, callbacks=[Stamp()])
    if not mw:
        trainer.train()
        return None
    # watch_trainer: the bundle is written when the exception leaves train(), even where the
    # caller catches it (here: the check) rather than letting it end the process.
    with watch_trainer(trainer, workers=False, out_dir=str(out)) as cb:
        trainer.train()
    return cb


def _accelerate(device: str, sz: dict[str, int], mw: bool, out: Path, oom: bool,
                stamp: Blocks) -> Any:
    import contextlib

    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from memwatch.integrations.accelerate import attach

    acc = Accelerator(cpu=device == "cpu", mixed_precision="bf16" if device == "cuda" else "no")
    model = gpt2(sz)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = DataLoader(Ids(sz["steps"] * sz["batch"], sz["seq"], sz["vocab"]),
                      batch_size=sz["batch"])
    model, opt, data = acc.prepare(model, opt, data)
    hook = attach(acc, opt, workers=False, out_dir=str(out)) if mw else None
    with hook if hook is not None else contextlib.nullcontext():
        for step, ids in enumerate(data):
            if oom and step == OOM_AT:
                _oom_now(acc.device)
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            stamp()
    return hook


RUNS: dict[str, Callable[..., Any]] = {"lightning": _lightning, "transformers": _transformers,
                                       "accelerate": _accelerate}


# --------------------------------------------------------------------------- the two checks

def ratio(framework: str, device: str, out: Path) -> dict[str, Any]:
    """Median step time with memwatch over without, in alternating runs (off, on, on, off, ...),
    timed over blocks of steps with the device synchronised only at block ends; then one more
    run with memwatch, of a few steps, under the sync debug mode: the synchronisations memwatch
    made (CUDA only)."""
    sz = SIZES[device]
    times: dict[str, list[float]] = {"off": [], "on": []}
    per_run: list[dict[str, Any]] = []
    for pair in range(sz["pairs"]):
        for mode in (("off", "on") if pair % 2 == 0 else ("on", "off")):
            stamp = Blocks(device)
            with tempfile.TemporaryDirectory(dir=out) as tmp:
                RUNS[framework](device, sz, mode == "on", Path(tmp), False, stamp)
            d = stamp.per_step()
            times[mode].extend(d)
            per_run.append({"mode": mode, "blocks": len(d), "steps": stamp.n,
                            "median_ms": statistics.median(d) * 1e3 if d else None})
    doc = ratio_summary(times["on"], times["off"])
    syncs: dict[str, Any] | None = None
    if device == "cuda":
        with tempfile.TemporaryDirectory(dir=out) as tmp, SyncCounter() as counter:
            RUNS[framework](device, {**sz, "steps": SYNC_STEPS}, True, Path(tmp), False,
                            Blocks("cpu"))
        syncs = counter.result()
    failed = device == "cuda" and (doc["above_limit"] or (syncs or {}).get("syncs_memwatch"))
    return {"status": "failed" if failed else "passed", "framework": framework, "device": device,
            **doc, "runs": per_run, "syncs": syncs,
            "model": "GPT-2 from a config, {n_layer} layers, {n_embd} wide, seq {seq}, "
                     "batch {batch}".format(**sz),
            "precision": "bf16" if device == "cuda" else "fp32",
            "target": "on CUDA: the ratio's interval not above 1.01, no synchronisation made "
                      "by memwatch (the CPU smoke run checks only that it runs)"}


def oom(framework: str, device: str, out: Path) -> dict[str, Any]:
    """A real OOM at step 3 ends the run with one bundle: before unwind on CUDA, the allocator's
    segments and the census's groups in it."""
    from memwatch.bundle import find_bundles
    from memwatch.bundle.format import dir_size

    d = out / f"oom-{framework}-{device}"
    raised: BaseException | None = None
    try:
        sz = SIZES["cuda_oom" if device == "cuda" else device]
        RUNS[framework](device, sz, True, d, True, Blocks("cpu"))
    except BaseException as e:  # noqa: BLE001 - the OOM (whatever the framework wrapped it in)
        raised = e
    if raised is None:
        return {"status": "failed", "error": "the run ended without an out-of-memory error"}
    bundles = [(p, b) for p, b in find_bundles(d / "oom") if not isinstance(b, Exception)]
    if len(bundles) != 1:
        return {"status": "failed", "error": f"{len(bundles)} bundles (expected 1)",
                "exception": f"{type(raised).__name__}: {str(raised)[:300]}"}
    path, b = bundles[0]
    m = b.manifest
    census = b.read_json("census.json") or {}
    snap = b.snapshot() if device == "cuda" else None
    segments = len((snap or {}).get("segments", []))
    groups = census.get("groups", [])
    if device == "cuda":
        ok = m.get("pre_unwind") is True and m.get("classification") == "cuda_oom" and \
            segments > 0 and any(str(g.get("device", "")).startswith("cuda") for g in groups)
    else:
        ok = m.get("classification") == "host_oom" and bool(groups)
    return {"status": "passed" if ok else "failed", "framework": framework, "device": device,
            "bundle": str(path), "bundle_bytes": dir_size(path), "trigger": m.get("trigger"),
            "classification": m.get("classification"), "pre_unwind": m.get("pre_unwind"),
            "segments": segments, "census_groups": len(groups),
            "exception": f"{type(raised).__name__}: {str(raised)[:200]}",
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def parts() -> Iterator[tuple[str, str, str, str]]:
    """(part name, kind, framework, what) of every adapter part gpu_check runs on CUDA."""
    for fw in FRAMEWORKS:
        yield (f"2c_ratio_{fw}", "ratio", fw,
               f"{fw}: bf16 GPT-2 step time with/without memwatch, alternating runs")
    for fw in FRAMEWORKS:
        yield (f"2d_oom_{fw}", "oom", fw, f"a real CUDA OOM inside {fw}: one bundle, before "
               "unwind, with segments and the census")
        yield (f"2d_oom_{fw}_expandable", "oom", fw, f"the same inside {fw} with "
               "expandable_segments:True")


def run_part(name: str, out_dir: Path, timeout: int, device: str = "cuda") -> dict[str, Any]:
    """Run the adapter part ``name`` (from :func:`parts`) in a child process, on CUDA (or on the
    CPU, small, for a rehearsal of the check), killed after ``timeout`` seconds."""
    kind, fw, what = next((k, f, w) for n, k, f, w in parts() if n == name)
    res = out_dir / f"{name}.json"
    env = EXPANDABLE if name.endswith("_expandable") else {}
    return spawn([__file__, kind, fw, device, str(res), str(out_dir / name)], res, what,
                 timeout, env)


def main(argv: list[str]) -> int:
    kind, framework, device, res, out = argv[0], argv[1], argv[2], Path(argv[3]), Path(argv[4])
    out.mkdir(parents=True, exist_ok=True)
    return write_result(res, lambda: (ratio if kind == "ratio" else oom)(framework, device, out))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
