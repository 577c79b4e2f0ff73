"""What a user reads on the console: the HF Trainer's printed rows and memwatch's warning.

Two measurements, side by side in one run:

* **printed rows**: a tiny BERT trained by a real ``Trainer`` (CPU, ``PrinterCallback``,
  ``logging_steps=5``) with ``MemWatchCallback(console=...)`` for ``"all"`` (every memwatch key on
  every printed row: what the console showed before the option existed), ``"one"`` (the
  default) and ``"none"``: the printed loss rows' width and memwatch keys, and the memwatch keys
  ``log_history`` kept (every one, whatever the option);
* **the warning**: a real leak finding (a plain loop keeping 256 KiB per step in a list) worded
  as the previous ``FindingWarner`` did (one line: the message, ``Held by:``, the suggestions
  joined by ``; ``) and as it is now (a short first line, then the verdict, the holder and each
  suggestion on lines of their own).

    python benchmarks/bench_console.py            # prints the table, writes results/console.json
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common  # noqa: E402


def printed_rows(console: str, steps: int) -> dict[str, Any]:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from memwatch.integrations.transformers import MemWatchCallback

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(1, 100, (64,), generator=g), "labels": i % 2}
            for i in range(8 * steps)]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(tmp, use_cpu=True, per_device_train_batch_size=8,
                                 num_train_epochs=2, report_to=[], save_strategy="no",
                                 disable_tqdm=True, logging_steps=5, seed=0)
        cb = MemWatchCallback(workers=False, console=console)
        trainer = Trainer(BertForSequenceClassification(cfg), args, train_dataset=data,
                          callbacks=[cb])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            trainer.train()
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{'loss'")]
    rows = [ast.literal_eval(line) for line in lines]
    kept = [r for r in trainer.state.log_history if "loss" in r]
    own = [line for line in out.getvalue().splitlines() if "memwatch/findings/" in line]
    return {
        "console": console, "rows": len(rows),
        "max_width": max(map(len, lines)), "median_width": sorted(map(len, lines))[len(lines) // 2],
        "memwatch_keys_printed": max(sum(k.startswith("memwatch/") for k in r) for r in rows),
        "memwatch_keys_in_log_history": min(sum(k.startswith("memwatch/") for k in r)
                                            for r in kept),
        "own_rows_printed": len(own),
    }


def leak_finding(tmp: str) -> Any:
    """A real leak finding: a plain loop that keeps 256 KiB per step in a list."""
    import torch

    import memwatch

    kept: list[torch.Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("memwatch").setLevel(logging.ERROR)
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp, recorder=False,
                            total_steps=10_000_000) as mw:
            for _ in range(3):
                for _ in range(100):
                    kept.append(torch.ones(65536))
                    mw.step()
                mw.end_epoch()
    leaks = [f for f in mw.findings if f.kind == "leak"]
    return leaks[-1] if leaks else None


def old_text(f: Any) -> str:
    """How the previous FindingWarner worded a warning (one line)."""
    text = f"memwatch: {f.kind} in {f.metric}: {f.message}"
    if f.culprit and f.culprit not in text:
        text += f" Held by: {f.culprit}."
    if f.suggestions:
        text += " Try: " + "; ".join(f.suggestions)
    return text


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per epoch (2 epochs)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "console.json"))
    a = ap.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from memwatch.runtime.warn import warning_text

    rows = [printed_rows(c, a.steps) for c in ("all", "one", "none")]
    print(f"{'console=':10} {'rows':>5} {'max width':>10} {'median':>7} "
          f"{'memwatch keys printed':>22} {'in log_history':>15} {'own rows printed':>17}")
    for r in rows:
        print(f"{r['console']:10} {r['rows']:5} {r['max_width']:10} {r['median_width']:7} "
              f"{r['memwatch_keys_printed']:22} {r['memwatch_keys_in_log_history']:15} "
              f"{r['own_rows_printed']:17}")
    with tempfile.TemporaryDirectory() as tmp:
        f = leak_finding(tmp)
    warning: dict[str, Any] = {}
    if f is not None:
        before, after = old_text(f), warning_text(f)
        warning = {"before_lines": len(before.splitlines()),
                   "before_first_line": len(before.splitlines()[0]),
                   "after_lines": len(after.splitlines()),
                   "after_first_line": len(after.splitlines()[0]),
                   "after_longest_line": max(map(len, after.splitlines())),
                   "suggestions": len(f.suggestions), "after": after}
        print(f"\nwarning of a real leak finding: before {warning['before_lines']} line of "
              f"{warning['before_first_line']} characters; after: first line "
              f"{warning['after_first_line']} characters, {warning['after_lines']} lines, the "
              f"longest {warning['after_longest_line']}\n\n{after}")
    out = {"meta": _common.platform_info(), "printed_rows": rows, "warning": warning}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
