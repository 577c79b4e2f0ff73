"""Issue 16: the right culprit, in bytes, on leaks of Python objects, autograd chains and views.

The loops (tests/culprit_loops.py) run in their own interpreters: host RSS is the signal, and
other tests' heaps would move it. Unit tests below check the weighing and naming directly.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loop_runs import LoopRuns
from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.census import containers
from memwatch.analysis.culprits.growth import weigh as W
from memwatch.analysis.culprits.holders import holders as H
from memwatch.analysis.evidence import ContainerGrowth

run_loop = LoopRuns(Path(__file__).with_name("culprit_loops.py"), no_torch=("bytearray_no_torch",))


def _first_leak(epochs: list[list[dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
    for i, fs in enumerate(epochs):
        for f in fs:
            assert f["kind"] != "allocator_retention", f["message"]
            if f["kind"] == "leak" and f["metric"] == "host.rss":
                return i, f
    raise AssertionError(f"no host leak: {epochs}")


# mode: (the culprit must contain, a suggestion must contain)
LOOPS = {
    "numpy_list": ("culprit_loops.kept_arrays (list,", "bound it"),
    "bytearray_no_torch": ("culprit_loops.debug_frames (list,", "bound it"),
    "graph_sum": ("local total", "loss.item()"),
    "views": ("local metric.kept (list,", ".clone()"),
    # a list only a running frame holds (the collector does not see running frames)
    "local_list": ("run() (culprit_loops.py:", "bound it"),
}


@pytest.mark.parametrize("mode", sorted(LOOPS))
def test_leak_named_in_bytes_at_its_holder(mode: str, tmp_path: Path) -> None:
    epoch, leak = _first_leak(run_loop(mode, tmp_path))
    culprit, fix = LOOPS[mode]
    assert culprit in leak["culprit"], leak["culprit"]
    if mode == "local_list":
        assert ": local kept_grads (list," in leak["culprit"], leak["culprit"]
    assert any(fix in s for s in leak["suggestions"]), leak["suggestions"]
    # confirmed at the second check after the leak starts (epoch 0 is the first)
    assert epoch <= 2, epoch
    # the same culprit at every later check: attribution follows the bytes
    later = [f["culprit"].split(" (")[0].split(" — ")[0] for fs in run_loop(mode, tmp_path)
             for f in fs if f["kind"] == "leak" and f["metric"] == "host.rss"]
    assert len(set(later)) == 1, later


def test_numpy_leak_is_weighed_not_counted(tmp_path: Path) -> None:
    _, leak = _first_leak(run_loop("numpy_list", tmp_path))
    # One array a step between the two censuses diffed: the previous one at the last check
    # (200 steps an epoch), or at a check sized to the run inside the first epoch (step 100,
    # where its CPU floor allows: then "since step 100").
    a, b = leak["evidence"]["census_at_steps"]
    n = b - a
    since = "since the last check" if n == 200 else f"since step {a:,}"
    assert f"+{n} {since}" in leak["culprit"] and "numpy arrays" in leak["culprit"], \
        (leak["culprit"], a, b)
    # n arrays of 100 KiB: the weight is the arrays' buffers, not n x 64 bytes
    assert 0.95 * n * 100 * 2**10 <= leak["evidence"]["culprit_bytes"] <= \
        1.05 * n * 100 * 2**10


def test_graph_chain_counts_nodes(tmp_path: Path) -> None:
    _, leak = _first_leak(run_loop("graph_sum", tmp_path))
    assert "autograd graph grew by" in leak["culprit"]
    # 12 Linear+ReLU layers: ~40 nodes chained per step, 200 steps between checks
    assert 100 * 200 > leak["evidence"]["graph_nodes_delta"] >= 20 * 200


def test_string_dict_weighed() -> None:
    step_log: dict[str, str] = {}
    c0 = C.take_census()
    for i in range(200):
        step_log[f"step {i}"] = "x" * 5000
    assert not __import__("gc").is_tracked(step_log)  # a dict of str: CPython untracks it
    c1 = C.take_census()
    # a local of a running user function, untracked, is found (issue 23: a new user's first
    # leak is often a dict in main()) ...
    assert c1.containers[id(step_log)] == (200, "dict")
    holder = Holder()
    holder.log = step_log
    c2 = C.take_census()
    # ... and so it is held by an instance of a user class, and weighed in bytes
    grown = [g for g in containers.container_growth(c0.containers, c2.containers)
             if g.obj_id == id(step_log)]
    assert grown and grown[0].len_delta == 200
    scale = W.Scale()
    W.weigh_growth(grown[0], step_log, scale)
    scale.close()
    assert 200 * 5000 <= grown[0].bytes_delta <= 200 * 5400
    assert grown[0].element == "strings"
    del c1


class Holder:
    log: dict[str, str]


def test_weigh_follows_views_and_containers() -> None:
    base = np.zeros(100_000)  # 800 KB
    view = base[:10]
    s = W.Scale()
    assert s.weigh([view, view]) >= 800_000  # the view weighs its base, once
    s.close()
    s = W.Scale()
    nested = {"a": [np.ones(1000) for _ in range(10)], "b": b"x" * 10_000}
    assert 10 * 8000 + 10_000 <= s.weigh(nested) <= 10 * 8200 + 12_000
    s.close()


def test_view_claims_its_base_storage() -> None:
    """A base alive beside its view: the view's group counts the storage, since whoever holds
    the view holds the base."""
    base = torch.zeros(64, 1024)  # 256 KiB
    views = [base.view(-1)[:8]]
    c = C.take_census()
    vg = c.groups[("cpu", "torch.float32", (8,), False, "")]
    bg = c.groups[("cpu", "torch.float32", (64, 1024), False, "")]
    assert vg.bytes >= 64 * 1024 * 4 and vg.views >= 1
    assert bg.bytes < 64 * 1024 * 4 * bg.count  # not counted twice
    del views


def test_names_read_at_a_glance() -> None:
    kept: collections.deque[torch.Tensor] = collections.deque()
    owner = Holder()
    owner.kept = kept  # type: ignore[attr-defined]
    for _ in range(30):
        kept.append(torch.ones(2))
    h = H.holder_of(kept[17])
    assert h is not None
    assert h.path.endswith("Holder.kept") or h.path.endswith(".kept"), h.path
    assert "[17]" not in h.path
    assert h.describe(5).endswith("(deque, 30 tensors, +5 since the last check)")


def test_memwatch_own_containers_left_out() -> None:
    c0 = C.take_census()
    c1 = C.take_census()
    # the previous census's containers dict is memwatch's own: never recorded as growth
    assert id(c0.containers) not in c1.containers
    assert id(c0.types) not in c1.containers


def test_memwatch_module_caches_left_out() -> None:
    from memwatch.analysis.culprits.census import ownership as o

    for i in range(40):  # memwatch's per-type cache grows as new types are met
        o.is_user_type(type(f"T{i}", (), {}))
    c = C.take_census()
    assert id(o._user_type) not in c.containers


def test_classes_weigh_nothing() -> None:
    s = W.Scale()
    assert s.weigh({int: True, str: False, np.ndarray: True}) < 1000  # the dict and 3 bools
    s.close()


def test_dict_of_tuples_reads_as_tuples() -> None:
    cache = {i: (torch.ones(4), i) for i in range(20)}
    assert W.element_name(cache[3]) == "tuples"
    g = ContainerGrowth(id(cache), "dict", 20, 20, True)
    s = W.Scale()
    W.weigh_growth(g, cache, s)
    s.close()
    assert g.element == "tuples" and g.bytes_delta >= 20 * 16


class _Prepared:
    """A framework object that keeps every model it prepared (accelerate#84's shape)."""

    def __init__(self) -> None:
        self._models: list[torch.nn.Module] = []


PREPARED = _Prepared()


def test_a_short_growing_list_of_models_is_the_holder_not_the_model() -> None:
    """A list of five models that gains three between censuses is recorded (lists from 4
    elements), so the walk from a weight names the list that keeps gaining models, not the
    outermost module it passes through."""
    PREPARED._models[:] = [torch.nn.Sequential(torch.nn.Linear(64, 64)) for _ in range(5)]
    c0 = C.take_census()
    PREPARED._models.extend(torch.nn.Sequential(torch.nn.Linear(64, 64)) for _ in range(3))
    c1 = C.take_census()
    grown = {g.obj_id: g.len_delta
             for g in containers.container_growth(c0.containers, c1.containers)}
    assert grown.get(id(PREPARED._models)) == 3
    weight = PREPARED._models[-1][0].weight
    h = H.holder_of(weight, owners=grown)
    assert h is not None and h.path.endswith("PREPARED._models"), h
    assert h.owner_delta == 3


class _Trials:
    def __init__(self) -> None:
        self.optimizers: list[torch.optim.Optimizer] = []


TRIALS = _Trials()


def test_optimizer_state_is_told_unless_optimizers_accumulate() -> None:
    """The walk from an Adam moment passes through ``optimizer.state[param]``: the holder says
    so (state created once per parameter, bounded). When the optimizers themselves pile up in a
    container that grew since the previous census (a new optimizer over the same parameters
    every trial), the same moment's holder is that container, and no longer bounded."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    opt.step()
    holder = {"opt": opt}  # noqa: F841 - reachable from this frame only
    h = H.holder_of(opt.state[model.weight]["exp_avg"])
    assert h is not None and h.optimizer_state, h
    assert not H.holder_of(model.weight).optimizer_state  # type: ignore[union-attr]

    TRIALS.optimizers[:] = [torch.optim.Adam(model.parameters()) for _ in range(5)]
    c0 = C.take_census()
    TRIALS.optimizers.extend(torch.optim.Adam(model.parameters()) for _ in range(3))
    for o in TRIALS.optimizers:
        o.step()
    del o  # the walk must meet the list, not this frame's loop variable
    c1 = C.take_census()
    grown = {g.obj_id: g.len_delta
             for g in containers.container_growth(c0.containers, c1.containers)}
    assert grown.get(id(TRIALS.optimizers)) == 3
    h = H.holder_of(TRIALS.optimizers[-1].state[model.weight]["exp_avg"], owners=grown)
    assert h is not None and h.path.endswith("TRIALS.optimizers"), h
    assert not h.optimizer_state
