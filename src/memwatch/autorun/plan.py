"""The plan ``memwatch run`` hands to the processes it starts: which of them is the training
script (a script path or a module name) and the :class:`memwatch.MemWatch` options the user
gave; JSON in one environment variable, :data:`ENV`.

The parent writes it (:mod:`memwatch.autorun.launch`), the shim finds it at start-up, the
controller reads it (:func:`read_plan`). How the report at exit is written is an option
(``report``) like any other.

Example::

    >>> import json
    >>> from memwatch.autorun.plan import Plan, Target, read_plan
    >>> plan = Plan(Target(module="pkg.train"), {"check_every_n_steps": 100})
    >>> read_plan(json.loads(plan.encode())) == plan
    True
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ENV", "PLAN_VERSION", "Plan", "Target", "read_plan"]

#: The environment variable that holds the plan (the shim reads the same name).
ENV = "MEMWATCH_RUN"
PLAN_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Target:
    """The training script: a path (``script``) or a module run with ``-m`` (``module``)."""

    script: str | None = None
    module: str | None = None

    def describe(self) -> str:
        return f"the script {self.script}" if self.script else f"the module {self.module}"

    def to_json(self) -> dict[str, str]:
        return {"script": self.script} if self.script else {"module": str(self.module)}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every process of the watched command reads from :data:`ENV`."""

    target: Target
    #: :class:`memwatch.MemWatch` options the user gave (JSON-able values only).
    options: Mapping[str, Any]

    def encode(self) -> str:
        return json.dumps({"version": PLAN_VERSION, "target": self.target.to_json(),
                           "options": dict(self.options)},
                          allow_nan=False, separators=(",", ":"))


def read_plan(doc: Any) -> Plan:
    """The plan from its decoded JSON; ``ValueError`` naming what is wrong."""
    if not isinstance(doc, dict) or doc.get("version") != PLAN_VERSION:
        raise ValueError(f"{ENV} holds no plan of version {PLAN_VERSION}; run the command "
                         "through `memwatch run` of the memwatch installed here")
    t = doc.get("target") or {}
    options = doc.get("options")
    if not isinstance(options, dict) or not isinstance(t, dict):
        raise ValueError(f"{ENV}: malformed plan")
    return Plan(Target(script=t.get("script"), module=t.get("module")), options)
