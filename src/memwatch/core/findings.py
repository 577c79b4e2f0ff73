"""The :class:`Finding` record: one verdict about one metric, born complete and immutable.

A finding is created once, at the check that judged it, with everything that says where it came
from (:class:`Origin`: epoch, step, rank, stage, check). No later layer completes or edits it:
the sinks, the adapters and the user all see the same object.

A finding is redacted when it is born (:mod:`memwatch.core.redact`: its message, culprit,
suggestions and every string of its evidence): a token-shaped key of a leaking dict
(``store['hf_...']``) never reaches the black box, the JSONL log, W&B tables or a report.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NoReturn

from memwatch.core.redact import redact_obj, redact_text

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
#: The loops a session can watch; ``"train"`` is the one leak verdicts are mostly about.
STAGES: tuple[str, ...] = ("train", "val", "test", "predict")

#: Every ``Finding.kind`` the analyzer emits.
KINDS: tuple[str, ...] = (
    "leak",
    "plateau",
    "step_change",
    "accumulation",
    "fragmentation",
    "allocator_retention",
    "mapped_file",
    "near_oom",
    "rank_leak",
    "rank_near_oom",
    "rank_imbalance",
    "rank_unresponsive",
)
# Worker findings use these kinds too: per-worker growth is a ``leak`` and copy-on-write a
# ``plateau``. Which rule made a finding is its ``rule`` (the names of
# ``memwatch.analysis.rules``); ``evidence["pattern"]`` names the variant where the docs list
# one ("per_worker_growth", "copy_on_write", "native_memory"...).


class FrozenDict(dict):  # type: ignore[type-arg]
    """A ``dict`` that refuses changes: a finding's evidence, readable and JSON-able as a dict.

    Example::

        >>> d = FrozenDict({"a": 1})
        >>> d["a"], dict(d)
        (1, {'a': 1})
        >>> d["b"] = 2
        Traceback (most recent call last):
        ...
        TypeError: a finding's evidence is read-only; build a new Finding instead
    """

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a finding's evidence is read-only; build a new Finding instead")

    __setitem__ = __delitem__ = _readonly
    clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle/copy would rebuild a dict subclass item by item through __setitem__.
        return (FrozenDict, (dict(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return FrozenDict(copy.deepcopy(dict(self), memo))


@dataclasses.dataclass(frozen=True)
class Finding:
    """A verdict about one metric.

    Example::

        >>> from memwatch import Finding
        >>> f = Finding(kind="leak", metric="host.rss", severity="warning",
        ...             message="host.rss grows by 16.0 KiB per step.", bytes_per_step=16384.0)
        >>> f.to_dict()["kind"], f.stage
        ('leak', 'train')
    """

    kind: str
    metric: str
    severity: Severity
    message: str
    bytes_per_step: float | None = None
    steps_to_oom: float | None = None
    seconds_to_oom: float | None = None
    culprit: str | None = None
    suggestions: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)
    epoch: int | None = None
    step: int | None = None
    rank: int | None = None  # set when running distributed (world size > 1)
    #: The loop the finding is about: "train", "val", "test" or "predict". Non-training
    #: findings also say it in ``evidence["stage"]``.
    stage: str = "train"
    #: Which check of its session judged it (0, 1, ...), when it came from one.
    check: int | None = None
    #: The analyzer rule that made it ("leak", "native", "worker_count", "ranks"...: the
    #: names of ``memwatch.analysis.rules``); None for a finding made elsewhere or saved
    #: before findings named their rule.
    rule: str | None = None
    #: The belief this finding states (``"train/host/1"``: the loop, the metric's family and
    #: a number): one suspected leak, or one shape of one metric, judged again at every check.
    #: The findings of one belief are its history, the latest its current state (see
    #: :func:`memwatch.analysis.beliefs.current`); None for a finding saved before beliefs.
    belief: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"Finding.severity must be one of {SEVERITIES}, got {self.severity!r}"
            )
        if self.stage not in STAGES:
            raise ValueError(f"Finding.stage must be one of {STAGES}, got {self.stage!r}")
        evidence = dict(self.evidence)
        if self.stage != "train":
            evidence.setdefault("stage", self.stage)
        # Redacted at birth: every path out of the process (bundle, black box, JSONL, W&B,
        # Prometheus, reports) gets the finding already clean.
        object.__setattr__(self, "evidence", FrozenDict(redact_obj(evidence)))
        object.__setattr__(self, "suggestions",
                           tuple(redact_text(s) if isinstance(s, str) else s
                                 for s in self.suggestions))
        if isinstance(self.message, str):
            object.__setattr__(self, "message", redact_text(self.message))
        if isinstance(self.culprit, str):
            object.__setattr__(self, "culprit", redact_text(self.culprit))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (plain dicts and lists, copied)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["evidence"] = copy.deepcopy(dict(self.evidence))
        d["suggestions"] = list(self.suggestions)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        if fields.get("stage") is None:  # saved before findings had a stage
            ev = fields.get("evidence") or {}
            fields["stage"] = ev.get("stage", "train") if isinstance(ev, Mapping) else "train"
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a finding comes from: the check (epoch end or inside an epoch) that judged it.

    Verdict code builds findings through :meth:`finding`, so every one is complete at birth,
    the rule that made it named.

    Example::

        >>> o = Origin(epoch=2, step=300, stage="val", check=2)
        >>> f = o.finding(rule="leak", kind="plateau", metric="host.rss", severity="info",
        ...               message="...")
        >>> f.epoch, f.step, f.stage, f.evidence["stage"], f.rule
        (2, 300, 'val', 'val', 'leak')
    """

    epoch: int | None = None
    step: int | None = None
    rank: int | None = None
    stage: str = "train"
    check: int | None = None

    def finding(self, *, rule: str, suggestions: Iterable[str] = (),
                evidence: Mapping[str, Any] | None = None, **fields: Any) -> Finding:
        """A :class:`Finding` born here, made by ``rule`` (a rule's name); ``fields`` may name
        another ``rank`` (a cross-rank verdict is about the rank it names, though rank 0
        judged it)."""
        where: dict[str, Any] = {"epoch": self.epoch, "step": self.step, "rank": self.rank,
                                 "stage": self.stage, "check": self.check, "rule": rule}
        where.update(fields)
        return Finding(suggestions=tuple(suggestions), evidence=dict(evidence or {}), **where)


def with_origin(f: Finding, origin: Origin) -> Finding:
    """``f`` as it would have been born at ``origin`` (for findings replayed from a checkpoint
    or received from another rank, whose origin is known only to the receiver)."""
    return dataclasses.replace(f, epoch=origin.epoch, step=origin.step, rank=origin.rank,
                               stage=origin.stage, check=origin.check)
