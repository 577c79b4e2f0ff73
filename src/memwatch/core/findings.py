"""The :class:`Finding` record: one verdict about one metric at one epoch end."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")

#: Every ``Finding.kind`` the analyzer emits.
KINDS: tuple[str, ...] = (
    "leak",
    "plateau",
    "step_change",
    "accumulation",
    "fragmentation",
    "allocator_retention",
    "near_oom",
    "rank_leak",
    "rank_near_oom",
    "rank_imbalance",
    "rank_unresponsive",
)
# Worker findings use these kinds too: per-worker growth is a ``leak`` and copy-on-write a
# ``plateau``; ``evidence["pattern"]`` says which ("per_worker_growth", "copy_on_write").


@dataclasses.dataclass
class Finding:
    """A verdict about one metric.

    Example::

        >>> from memwatch import Finding
        >>> f = Finding(kind="leak", metric="host.rss", severity="warning",
        ...             message="host.rss grows by 16.0 KiB per step.", bytes_per_step=16384.0)
        >>> f.to_dict()["kind"]
        'leak'
    """

    kind: str
    metric: str
    severity: Severity
    message: str
    bytes_per_step: float | None = None
    steps_to_oom: float | None = None
    seconds_to_oom: float | None = None
    culprit: str | None = None
    suggestions: list[str] = dataclasses.field(default_factory=list)
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    epoch: int | None = None
    step: int | None = None
    rank: int | None = None  # set when running distributed (world size > 1)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"Finding.severity must be one of {SEVERITIES}, got {self.severity!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
