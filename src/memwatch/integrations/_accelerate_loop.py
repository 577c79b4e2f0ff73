"""What the Accelerate hook reads of an ``Accelerator``'s loop: that it is given one, the torch
optimizer that really steps inside the ``AcceleratedOptimizer``, and the batch size
``find_executable_batch_size`` retries with (its frame, up the stack)."""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

from memwatch.core.optional import require
from memwatch.integrations import _framework as fw

__all__ = ["FEBS_FILE", "check_accelerator", "febs_batch_size", "torch_optimizer"]

_WHO = "memwatch.integrations.accelerate"
_acc_memory = require("accelerate.utils.memory", extra="accelerate", who=_WHO)
AcceleratedOptimizer = require("accelerate.optimizer", extra="accelerate",
                               who=_WHO).AcceleratedOptimizer
#: find_executable_batch_size's retry loop is the nested function ``decorator`` of this file; its
#: frame (alive while the retried function runs) holds the current ``batch_size``.
FEBS_FILE = os.path.normcase(os.path.abspath(_acc_memory.__file__ or ""))


def check_accelerator(accelerator: Any) -> None:
    fw.check_choice("accelerator", accelerator, hasattr(accelerator, "gradient_state"),
                     "pass the accelerate.Accelerator your loop prepared its model and "
                     "optimizer with")


def torch_optimizer(accelerator: Any, optimizer: Any) -> Any:
    """The torch optimizer that really steps (an AcceleratedOptimizer does not take hooks)."""
    prepared = list(getattr(accelerator, "_optimizers", []))
    fw.check_choice("optimizer", optimizer, optimizer is not None or len(prepared) == 1,
                    f"attach(accelerator) found {len(prepared)} prepared optimizers; pass the "
                    "one that steps once per training step: attach(accelerator, optimizer)")
    inner = optimizer if optimizer is not None else prepared[0]
    while isinstance(inner, AcceleratedOptimizer):  # (DeepSpeed's wrapper sits inside it too)
        inner = inner.optimizer
    fw.check_choice("optimizer", optimizer, callable(getattr(inner, "register_step_post_hook",
                                                              None)),
                    "it has no register_step_post_hook(); pass a torch.optim optimizer "
                    "(torch >= 2.0) or the AcceleratedOptimizer wrapping one")
    return inner


def febs_batch_size(f: FrameType) -> int | None:
    """The batch size find_executable_batch_size's retry loop runs with, if ``f`` is that loop."""
    size = f.f_locals.get("batch_size") if f.f_code.co_name == "decorator" and \
        os.path.normcase(f.f_code.co_filename) == FEBS_FILE else None
    return size if isinstance(size, int) else None
