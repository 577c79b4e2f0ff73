"""The Accelerate docs' one-line example, as written: ``attach(accelerator, optimizer)`` and no
``detach()``. When the script returns, the interpreter's exit closes the hook as ``detach()``
would: the last word, the run's report and ``summary.json``, and no black-box record saying the
run "ended without a clean close"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from memwatch.bundle.blackbox import find_records
from memwatch.bundle.run_summary import read_summary


def test_the_docs_example_without_detach_ends_cleanly(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import torch
        from accelerate import Accelerator
        import memwatch.integrations.accelerate

        accelerator = Accelerator(cpu=True, project_dir={str(tmp_path)!r})
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        hook = memwatch.integrations.accelerate.attach(accelerator, optimizer, workers=False,
                                                       blackbox_every_s=0.05, interval_s=0.05)
        for epoch in range(2):
            for batch in loader:
                accelerator.backward(model(batch).sum())
                optimizer.step()
                optimizer.zero_grad()
        print("trained", hook.memwatch.step_count)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "trained 32" in r.stdout, r.stderr
    out = tmp_path / "memwatch"
    assert find_records(out) == []  # a clean end: no "ended without a clean close"
    doc = read_summary(out)
    assert doc["steps"] == 32 and doc["epochs"] == 2 and doc["exit"]["status"] == "completed"
    assert (out / "report.html").is_file()
