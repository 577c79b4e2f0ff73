"""Reports a person can look at: an offline HTML report and terminal summaries of a real run.

A tiny model trains with a planted leak (evaluation outputs kept with their autograd graphs)
on the GPU when there is one, else on the CPU, fed by a DataLoader with two workers. At every
epoch end a terminal summary is printed (rich tables on a terminal, plain text in a log). At the
end the example writes, into ``--out`` (default ``memwatch-out/``):

* ``report.html``: the live run's report (memory per metric with epoch ends, trends and the
  forecast to the limit, workers' USS vs RSS, findings with culprit and suggestions);
* ``events.jsonl`` and ``events-report.html``: the same run from its JSONL event log (what you
  would render on another machine: ``memwatch report events.jsonl``);
* a bundle under ``oom/`` (``mw.dump``) and its report, with the allocator state on a GPU.

Every HTML file is one self-contained page: copy it anywhere and open it offline.

    python examples/report_from_run.py                 # 4 epochs, about ten seconds on a CPU
    MEMWATCH_EXAMPLE_QUICK=1 python examples/report_from_run.py   # tiny (the test suite)

The charts need ``pip install 'memwatch[report]'`` (plotly and rich); without it the reports
still render, with tables and a note in place of charts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import memwatch
from memwatch.report.html import render_bundle_html, render_export, render_run, write_html
from memwatch.report.terminal import print_epoch_summary
from memwatch.sinks import JsonlSink

# The planted leak's container: evaluation outputs kept as tensors, graphs and all.
eval_outputs: list[Any] = []


def main(epochs: int, steps: int, out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(steps * 32, 256)
    y = x[:, :10].argmax(dim=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2,
                        persistent_workers=True)
    probe = torch.randn(64, 256, device=device)
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events.jsonl"
    if events.exists():
        events.unlink()
    with memwatch.watch(out_dir=out, sinks=[JsonlSink(events)], log_every_n_steps=1,
                        signals=False) as mw:
        for _ in range(epochs):
            for xb, yb in loader:
                xb, yb = xb.to(device), yb.to(device)
                loss = nn.functional.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                eval_outputs.append(model(probe))  # the bug: should be under torch.no_grad()
                mw.step()
            print_epoch_summary(mw, mw.end_epoch())
        live = render_run(mw, out / "report.html")
        bundle = mw.dump("end of the example")
    print(f"live run report: {live} ({live.stat().st_size / 2**20:.1f} MiB)")
    print(f"from the event log: {render_export(events, out / 'events-report.html')}")
    if bundle is not None:
        from memwatch.bundle import open_bundle

        page = write_html(render_bundle_html(open_bundle(bundle)), out / "bundle-report.html")
        print(f"bundle report: {page} (also {bundle / 'report.html'})")
    for f in mw.findings[-3:]:
        print(f"finding: [{f.severity}] {f.kind} {f.metric}: culprit {f.culprit}")


if __name__ == "__main__":
    quick = os.environ.get("MEMWATCH_EXAMPLE_QUICK") == "1"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3 if quick else 4)
    ap.add_argument("--steps", type=int, default=40 if quick else 60)
    ap.add_argument("--out", type=Path, default=Path("memwatch-out"))
    args = ap.parse_args()
    main(args.epochs, args.steps, args.out)
