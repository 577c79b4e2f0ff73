"""Device memory outside the caching allocator: what the driver says this process uses on the
device less what PyTorch's allocator has reserved (``device.outside_allocator``). The CUDA
context, cuBLAS/cuDNN workspaces (one per stream and handle), NCCL's communication buffers and
libraries that call ``cudaMalloc`` themselves (cupy, TensorRT, some custom kernels) live there;
``torch.cuda.memory_allocated()`` and the allocator snapshot never see it. Growth there that is
held across checks is its own verdict, with advice about those owners, not about tensors.
"""

from __future__ import annotations

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.stats.forecast import steps_to_limit
from memwatch.core.findings import Finding
from memwatch.core.units import fmt_bytes

__all__ = ["METRIC", "NAME", "RULE", "judge"]

NAME = "outside_allocator"

METRIC = "device.outside_allocator"


def judge(inp: RuleInput) -> list[Finding]:
    """A leak of device memory outside the caching allocator (said once)."""
    ctx, cfg = inp.ctx, inp.cfg
    hist = inp.history.get(METRIC, [])
    if len(hist) < 3 or cfg.held(hist) != "leak":
        return []  # three units: the context and workspaces come up during the first two
    cur = hist[-1]
    steps = sum(h.n_steps for h in hist[-3:-1]) or cur.n_steps
    grew = cur.floor - hist[-3].floor
    slope = grew / max(steps, 1)
    limit = ctx.limit("device.reserved")
    steps_to_oom = steps_to_limit(limit, cur.peak, slope)
    severity = inp.severity(steps_to_oom, cur)
    msg = (
        f"Device memory outside PyTorch's caching allocator grows: {fmt_bytes(hist[-3].floor)} → "
        f"{fmt_bytes(cur.floor)} over the last {len(hist[-3:])} checks ({fmt_bytes(slope)} per "
        "step). This is memory the driver counts for this process but `torch.cuda."
        "memory_reserved()` does not: the CUDA context, cuBLAS/cuDNN workspaces (one per stream "
        "and handle), NCCL buffers, or a library calling cudaMalloc itself. No tensor holds it, "
        "so the census and the allocator snapshot cannot name it."
    )
    if steps_to_oom is not None:
        msg += f" At this rate the device's {fmt_bytes(limit)} are reached in about " \
               f"{steps_to_oom:,.0f} steps."
    return [ctx.origin.finding(
        rule=NAME, kind="leak", metric=METRIC, severity=severity, message=msg,
        bytes_per_step=slope,
        steps_to_oom=steps_to_oom,
        seconds_to_oom=None if steps_to_oom is None else steps_to_oom * cur.seconds_per_step,
        culprit="device memory outside the caching allocator (driver, libraries)",
        suggestions=[
            "New CUDA streams or cuBLAS handles each get a workspace: reuse streams instead of "
            "creating them per step; `CUBLAS_WORKSPACE_CONFIG=:4096:8` bounds cuBLAS's.",
            "NCCL: new process groups or communicators per step each allocate buffers; create "
            "them once (`NCCL_BUFFSIZE` sizes them).",
            "Other libraries (cupy, TensorRT, custom extensions) allocating with cudaMalloc: "
            "route them through PyTorch's allocator or free what they allocate.",
        ],
        evidence={"floors": [h.floor for h in hist[-6:]],
                  "remaining_steps": ctx.remaining(cur)},
    )]


RULE: Rule[RuleInput] = Rule(name=NAME, kinds=frozenset({"leak"}), once=frozenset({"leak"}),
                             judge=judge, reads=(METRIC, "device.reserved"))
