"""The cost on the device's hot path (issue 29): ``mw.step()`` beside the reads it is made of,
the synchronisations memwatch makes, and the step-time ratio of a training step with memwatch
over without, for a plain loop and each adapter, each ratio with its 95% interval.

On a CUDA machine (``make gpu-check`` runs the same parts, with the rest of the GPU check) it
measures a GPT-2-small bf16 step; here, without CUDA, the same code runs on
:class:`memwatch.testing.FakeDevice` (``mw.step()``) and small on the CPU (the adapters' ratios),
which shows that it runs, not what a GPU costs: those figures are in docs/gpu-verification.md.

    python benchmarks/bench_gpu_cost.py            # prints the table, writes results/gpu_cost/
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402


def main() -> int:
    out = HERE / "results" / "gpu_cost"
    rc = gpu_check.main(["--out", str(out), "--budget-s", "400", "--rehearse", "--quick",
                         "--only", "step_cost", "--only", "syncs", "--only", "2c_"])
    print(f"JSON: {out / 'report.json'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
