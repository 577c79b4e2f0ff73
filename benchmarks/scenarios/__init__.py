"""The detection corpus: real CPU training loops with planted leaks, clean controls, and scripted
device series.

Every scenario is one module of this package, in the folder of what it is: ``planted/``
(leaks planted in real loops), ``controls/`` (clean loops), ``reported/`` (reproductions of
reported bugs, each beside its fixed twin; labels from the threads, see ``reported/README.md``),
``synthetic/`` (plain Python/numpy leaks) and ``device/`` (scripted accelerator series). A new
scenario goes in its folder and in :data:`NAMES`.

The reported bugs are split in two (``Scenario.split``): the *design* part (``reported/``, in
:data:`NAMES`) is what the analyzer's rules are designed and tested on; the *held-out* part
(``heldout/``, modules ``ho_rep_*`` and their twins ``ho_fix_*``, listed in :data:`HELDOUT` and
not in :data:`NAMES`) is scored only by ``bench_detection.py --split heldout``, never by the
tests, so that it stays a fair test of bugs the rules were not tuned on.

A module exposes ``SCENARIO`` (a :class:`Scenario`: what is planted and what a correct verdict
looks like) and
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

__all__ = ["GROUPS", "GROWTHS", "HELDOUT", "NAMES", "SPLITS", "Scenario", "all_scenarios",
           "group_of", "load", "split_names"]


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
            ``None`` where there is no holder (scripted device series) or, in scenarios written
            before issue 41, where the main process cannot see it (DataLoader workers' heaps);
            from issue 41 on a worker leak names the workers' Dataset attribute that grows.
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
        split: for reported scenarios and their twins, the part of the reported corpus they
            belong to: ``"design"`` (rules are designed on it; the tests run it) or
            ``"heldout"`` (scored only at the end, by the benchmark; module in ``heldout/``,
            named ``ho_rep_*``/``ho_fix_*``). Every other scenario is ``"design"``.
        growth: how the planted memory comes (issues 40 and 41; informative, and read by the
            corpus's sanity tests): ``"steady"`` (about the same every training step),
            ``"eval"`` (only during evaluation passes run between training steps, every
            ``eval_every`` steps), ``"stairs"`` (in jumps at epoch boundaries, flat in between)
            or ``"stops"`` (steady until ``stops_at_step``, flat after: a buffer or cache that
            reaches its bound).
        stops_at_step: for ``growth="stops"``, the global step (1-based) after which nothing more
            is kept; set by the bound (a capacity in steps), so the same at every run size.
        eval_every: the loop runs an evaluation pass every this many training steps (inline,
            between two training steps); ``None`` when it runs none inside epochs. Set for
            leaks that grow only during evaluation and for training leaks of a run that also
            evaluates.
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
    split: str = "design"
    growth: str = "steady"
    stops_at_step: int | None = None
    eval_every: int | None = None

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
        if self.split not in SPLITS:
            raise ValueError(f"{self.name}: split must be one of {', '.join(SPLITS)}")
        if self.split == "heldout" and not (self.reported or self.twin_of):
            raise ValueError(f"{self.name}: only reported scenarios and their twins are held out")
        if (self.split == "heldout") != self.name.startswith("ho_"):
            raise ValueError(f"{self.name}: held-out scenarios, and only they, are named ho_*")
        if self.growth not in GROWTHS:
            raise ValueError(f"{self.name}: growth must be one of {', '.join(GROWTHS)}")
        if (self.growth == "stops") != (self.stops_at_step is not None):
            raise ValueError(f"{self.name}: stops_at_step is set exactly for growth='stops'")
        if self.growth == "eval" and not self.eval_every:
            raise ValueError(f"{self.name}: growth='eval' declares eval_every")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


#: The parts of the reported corpus (``Scenario.split``).
SPLITS = ("design", "heldout")

#: How a scenario's planted memory comes (``Scenario.growth``).
GROWTHS = ("steady", "eval", "stairs", "stops")

#: The folder of each group, by the prefix of its modules' names.
GROUPS: dict[str, str] = {
    "ho_rep_": "heldout",
    "ho_fix_": "heldout",
    "leak_": "planted",
    "ctrl_": "controls",
    "rep_": "reported",
    "fix_": "reported",
    "syn_": "synthetic",
    "dev_": "device",
}

#: Every scenario module of the design corpus, by group (planted leaks, then controls, ...):
#: what the tests run and the rules are designed on. Keep sorted within each group.
NAMES: tuple[str, ...] = (
    # planted leaks in real training loops
    "leak_eval_outputs",
    "leak_from_epoch2",
    "leak_hook_outputs",
    "leak_hook_per_step",
    "leak_loss_history",
    "leak_lru_cache",
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
    "rep_accelerator_reuse",
    "rep_avgmeter_graph",
    "rep_epoch_end_outputs",
    "rep_eval_loader_forkbomb",
    "rep_eval_outputs_kept",
    "rep_gradcam_hooks",
    "rep_hook_activations",
    "rep_memoize_cache",
    "rep_mmap_page_cache",
    "rep_numpy_view_bases",
    "rep_outputs_across_epochs",
    "rep_patch_pool_fills",
    "rep_ring_buffer_prealloc",
    "rep_rnn_hidden_graph",
    "rep_sampler_index_list",
    "rep_train_outputs_uncleared",
    "rep_val_outputs_stored",
    "rep_val_outputs_uncleared",
    "rep_worker_cow_strings",
    "rep_wsi_cached_property",
    # their fixed twins (controls)
    "fix_accelerator_reuse",
    "fix_avgmeter_graph",
    "fix_epoch_end_outputs",
    "fix_eval_loader_forkbomb",
    "fix_eval_outputs_kept",
    "fix_gradcam_hooks",
    "fix_hook_activations",
    "fix_memoize_cache",
    "fix_mmap_page_cache",
    "fix_numpy_view_bases",
    "fix_outputs_across_epochs",
    "fix_patch_pool_fills",
    "fix_ring_buffer_prealloc",
    "fix_rnn_hidden_graph",
    "fix_sampler_index_list",
    "fix_train_outputs_uncleared",
    "fix_val_outputs_stored",
    "fix_val_outputs_uncleared",
    "fix_worker_cow_strings",
    "fix_wsi_cached_property",
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


#: The held-out part of the reported corpus (issue 23): reproductions and their twins that the
#: tests never run and the rules are not designed on; ``bench_detection.py --split heldout``
#: scores them. Chosen at random among the new reproductions (seed and procedure in
#: ``reported/README.md``). Keep sorted: reproductions, then twins.
HELDOUT: tuple[str, ...] = (
    "ho_rep_agent_id_dicts",
    "ho_rep_bounded_lru_tensors",
    "ho_rep_bpe_cache",
    "ho_rep_coco_dicts_cow",
    "ho_rep_fqn_cache_snapshots",
    "ho_rep_jit_trace_export",
    "ho_rep_method_lru_cache",
    "ho_rep_metric_no_reset",
    "ho_rep_policy_id_map",
    "ho_rep_replay_memory_fills",
    "ho_rep_shuffle_buffer",
    "ho_fix_agent_id_dicts",
    "ho_fix_bounded_lru_tensors",
    "ho_fix_bpe_cache",
    "ho_fix_coco_dicts_cow",
    "ho_fix_fqn_cache_snapshots",
    "ho_fix_jit_trace_export",
    "ho_fix_method_lru_cache",
    "ho_fix_metric_no_reset",
    "ho_fix_policy_id_map",
    "ho_fix_replay_memory_fills",
    "ho_fix_shuffle_buffer",
)


def group_of(name: str) -> str:
    """The folder a scenario lives in (``"planted"``, ``"reported"``...), from its name."""
    for prefix, folder in GROUPS.items():
        if name.startswith(prefix):
            return folder
    raise ValueError(f"scenario {name!r} has no group: its name starts with none of "
                     f"{', '.join(GROUPS)}")


def load(name: str) -> ModuleType:
    """Import one scenario module by name (design corpus or held-out)."""
    if name not in NAMES and name not in HELDOUT:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(NAMES + HELDOUT)}")
    return importlib.import_module(f"{__name__}.{group_of(name)}.{name}")


def split_names(split: str) -> tuple[str, ...]:
    """The reported scenarios and twins of one part of the reported corpus (``"design"``,
    ``"heldout"``) or of both (``"all"``), in corpus order."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"unknown split {split!r}; one of {', '.join(SPLITS)}, all")
    design = tuple(n for n in NAMES if group_of(n) == "reported")
    return {"design": design, "heldout": HELDOUT, "all": design + HELDOUT}[split]


def all_scenarios(heldout: bool = False) -> list[Scenario]:
    """Metadata of every scenario of the design corpus, and of the held-out part if asked
    (imports the modules; torch is imported lazily by them)."""
    return [load(n).SCENARIO for n in NAMES + (HELDOUT if heldout else ())]
