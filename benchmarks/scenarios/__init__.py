"""The detection corpus: real CPU training loops with planted leaks, clean controls, and scripted
device series.

Every scenario is one module of this package, in the folder of what it is: ``planted/``
(leaks planted in real loops), ``controls/`` (clean loops), ``reported/`` (reproductions of
reported bugs, each beside its fixed twin; labels from the threads, see ``reported/README.md``),
``synthetic/`` (plain Python/numpy leaks) and ``device/`` (scripted accelerator series). A new
scenario goes in its folder and in :data:`NAMES`. A module exposes ``SCENARIO`` (a
:class:`Scenario`: what is planted and what a correct verdict looks like) and
``run(mw, epochs, steps_per_epoch)``, which trains, calls ``mw.step()`` once per optimizer step
and returns the findings of every ``mw.end_epoch()`` (one list per epoch).
``benchmarks/bench_detection.py`` runs each one in its own process and scores the verdicts.

Example::

    >>> from benchmarks import scenarios
    >>> sc = scenarios.load("leak_loss_history").SCENARIO
    >>> sc.is_leak, sc.expected_metric, sc.expected_culprit
    (True, 'host', 'loss_history')
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

__all__ = ["GROUPS", "NAMES", "Scenario", "all_scenarios", "group_of", "load"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What one corpus entry plants and what a correct verdict looks like.

    Attributes:
        name: the module name.
        is_leak: memory is held across epochs and keeps growing (a leak verdict is right).
        leak_start_epoch: first epoch (0-based) whose samples show the leak; ``None`` for controls.
        expected_metric: prefix of the metric the leak shows in: ``host``, ``workers`` or
            ``device``.
        expected_culprit: a substring the finding's ``culprit`` must contain (case-insensitive);
            ``None`` where the main process cannot see the holder (DataLoader workers) or there
            is no holder (scripted device series).
        description: one line.
        expected_kind: the finding kind a perfect analyzer emits for the planted pattern
            (informative only; the targets are about leak verdicts).
        workers: the loop uses DataLoader worker processes (watch them).
        device_total: run on a :class:`memwatch.testing.FakeDevice` of this many bytes.
        true_oom_step: the step at which the scripted series would run out of device memory
            (the forecast is scored against it).
        planted_bytes_per_step: for leaks, the bytes the bug keeps per step on average (tensor
            payloads; for reproductions of reported bugs, measured where payloads say too
            little: see ``reported/README.md``; the sanity test checks the raw series grows by about
            this much).
        epochs, steps_per_epoch: the full run; ``quick_epochs``, ``quick_steps``: ``--quick``.
        source: the public issue thread the scenario reproduces (or, for a fixed twin, whose fix
            it applies). Required for ``reported`` scenarios and for twins.
        reported: a reproduction of a memory problem users reported in ``source``; its label
            (``is_leak``, ``expected_kind``) is the thread's conclusion, not what memwatch says.
        twin_of: for a fixed twin, the reported scenario it fixes (the same loop with the fix
            from the thread, or with the thread's non-leak behaviour absent); always a control.
    """

    name: str
    is_leak: bool
    leak_start_epoch: int | None
    expected_metric: str
    expected_culprit: str | None
    description: str
    expected_kind: str = "leak"
    workers: bool = False
    device_total: int | None = None
    true_oom_step: int | None = None
    planted_bytes_per_step: float | None = None
    epochs: int = 4
    steps_per_epoch: int = 200
    quick_epochs: int = 3
    quick_steps: int = 150
    source: str | None = None
    reported: bool = False
    twin_of: str | None = None

    def __post_init__(self) -> None:
        if self.is_leak != (self.leak_start_epoch is not None):
            raise ValueError(f"{self.name}: leak_start_epoch must be set exactly for leaks")
        if self.is_leak and not self.planted_bytes_per_step:
            raise ValueError(f"{self.name}: a leak declares planted_bytes_per_step")
        if self.expected_metric not in ("host", "workers", "device"):
            raise ValueError(f"{self.name}: expected_metric must be host, workers or device")
        if (self.reported or self.twin_of) and not (self.source or "").startswith("https://"):
            raise ValueError(f"{self.name}: a reported scenario or twin cites its thread in source")
        if self.twin_of is not None and (self.is_leak or self.reported):
            raise ValueError(f"{self.name}: a fixed twin is a control, not a reported bug")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


#: The folder of each group, by the prefix of its modules' names.
GROUPS: dict[str, str] = {
    "leak_": "planted",
    "ctrl_": "controls",
    "rep_": "reported",
    "fix_": "reported",
    "syn_": "synthetic",
    "dev_": "device",
}

#: Every scenario module, by group (planted leaks, then controls, ...). Keep sorted within each
#: group.
NAMES: tuple[str, ...] = (
    # planted leaks in real training loops
    "leak_eval_outputs",
    "leak_from_epoch2",
    "leak_hook_outputs",
    "leak_hook_per_step",
    "leak_loss_history",
    "leak_slow",
    "leak_staircase",
    "leak_stored_exceptions",
    "leak_trainer_attr",
    "leak_unbounded_cache",
    "leak_worker_cache",
    # clean controls in real training loops
    "ctrl_bounded_deque",
    "ctrl_clean",
    "ctrl_epoch_accumulation",
    "ctrl_grad_accumulation",
    "ctrl_late_optimizer_state",
    "ctrl_one_time_buffer",
    "ctrl_periodic_cache",
    "ctrl_periodic_temporaries",
    "ctrl_variable_batch",
    "ctrl_warmup_plateau",
    "ctrl_worker_clean",
    "ctrl_worker_cow",
    # reproductions of reported bugs (labels from the threads: leaks and non-leaks)
    "rep_avgmeter_graph",
    "rep_epoch_end_outputs",
    "rep_eval_loader_forkbomb",
    "rep_hook_activations",
    "rep_memoize_cache",
    "rep_mmap_page_cache",
    "rep_outputs_across_epochs",
    "rep_worker_cow_strings",
    # their fixed twins (controls)
    "fix_avgmeter_graph",
    "fix_epoch_end_outputs",
    "fix_eval_loader_forkbomb",
    "fix_hook_activations",
    "fix_memoize_cache",
    "fix_mmap_page_cache",
    "fix_outputs_across_epochs",
    "fix_worker_cow_strings",
    # synthetic plain Python/numpy leaks
    "syn_bytearray_no_torch",
    "syn_deque_late_bound",
    "syn_numpy_list",
    "syn_string_dict",
    # scripted device series (memwatch.testing.FakeDevice)
    "dev_leak_epoch2",
    "dev_linear_leak",
    "dev_noisy_leak",
    "dev_staircase_leak",
    "dev_clean_noisy",
    "dev_epoch_accumulation",
    "dev_fragmentation",
    "dev_fragmentation_scripted",
    "dev_one_time_step",
    "dev_plateau",
)


def group_of(name: str) -> str:
    """The folder a scenario lives in (``"planted"``, ``"reported"``...), from its name."""
    for prefix, folder in GROUPS.items():
        if name.startswith(prefix):
            return folder
    raise ValueError(f"scenario {name!r} has no group: its name starts with none of "
                     f"{', '.join(GROUPS)}")


def load(name: str) -> ModuleType:
    """Import one scenario module by name."""
    if name not in NAMES:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{group_of(name)}.{name}")


def all_scenarios() -> list[Scenario]:
    """Metadata of every scenario (imports the modules; torch is imported lazily by them)."""
    return [load(n).SCENARIO for n in NAMES]
