"""Issue 41: the holder is the user's. Never memwatch's own objects or routes through them, the
user's container rather than a framework's record of the same arrays, a functools cache named
by its function, and the growing container's own name in the fix."""

from __future__ import annotations

import functools
import os
import types
from typing import Any

import numpy as np
import torch

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.culprits import attribution
from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.census import ownership
from memwatch.analysis.culprits.holders import holders as H
from memwatch.analysis.culprits.holders.untracked import ArrayBases
from memwatch.analysis.culprits.wording import culprit_of
from memwatch.analysis.evidence import Attribution, CensusRecord
from memwatch.integrations.transformers import MemWatchCallback


class _UserTrainer:
    """The user's trainer: what memwatch's adapter keeps (``cb.trainer``), whose list grows."""

    def __init__(self) -> None:
        self.callback_handler = types.SimpleNamespace(callbacks=[])
        self.train_logits: list[torch.Tensor] = []


def _attribute(prev: C.Census, cur: C.Census, steps: int = 64) -> Attribution:
    pair = (CensusRecord(0, prev, 0.0, step=0), CensusRecord(1, cur, 0.0, step=steps))
    stats: Any = types.SimpleNamespace(n_steps=steps)
    return attribution.attribute("host.rss", stats, pair, CheckContext(), AnalyzerConfig(),
                                 growth=64 * 2**20)


def _everything_said(a: Attribution) -> str:
    culprit, suggestions, detail = culprit_of("host.rss", a)
    return " ".join([str(culprit), *suggestions, detail, repr(a.evidence())])


def test_nothing_of_ours_is_a_culprit_or_a_route() -> None:
    """Planted: the user's trainer is kept by a real MemWatchCallback (its attribute, its
    logger's closure), with the callback's attribute dicts materialised so that the collector
    lists them, and memwatch's own module-level cache of types grows by 300 entries between
    the censuses. The trainer's list that grows must be named by the user's variable, and
    nothing said may go through memwatch's objects or name its state."""
    trainer = _UserTrainer()
    cb = MemWatchCallback(workers=False)
    cb.trainer = trainer
    vars(cb), vars(cb._log)  # noqa: B018 - materialised: the collector now lists these dicts
    prev = C.take_census()
    planted = [type(f"Planted{i}", (), {})() for i in range(300)]  # memwatch's _TYPE_INFO grows
    trainer.train_logits.extend(torch.ones(256, 64) for _ in range(64))
    cur = C.take_census()
    a = _attribute(prev, cur)
    said = _everything_said(a)
    assert a.holder is not None, said
    assert "local trainer" in a.holder.path and a.holder.name == "trainer.train_logits", \
        a.holder
    for own in ("memwatch", "MemWatchCallback", "._log", "_TYPE_INFO", "lambda"):
        assert own not in said, (own, said)
    # memwatch's own module cache is not even a growing container of the census
    assert id(C._TYPE_INFO.data) not in cur.containers
    del planted


def test_our_own_functools_caches_are_not_containers_of_the_census() -> None:
    """memwatch's own ``lru_cache`` s (``ownership.is_user_file``, filled by every census) grow
    with the run by design: the census leaves them out, while a user's cache is recorded."""
    prev = C.take_census()
    for i in range(50):
        ownership.is_user_file(f"/nowhere/planted_{i}.py")
        adapter_for(_MODEL, 10_000 + i)
    cur = C.take_census()
    assert id(ownership.is_user_file) not in cur.containers
    assert id(ownership.excluded) not in cur.containers
    assert cur.containers[id(adapter_for)][1] == "cache"  # (the user's, beside it)
    assert cur.containers[id(adapter_for)][0] >= 50
    assert id(ownership.is_user_file) not in prev.containers
    adapter_for.cache_clear()


def test_what_only_our_adapter_keeps_names_nobody() -> None:
    """A user object that only memwatch's adapter keeps has no holder worth naming: the walk
    says it is memwatch's (never ``cb.trainer.train_logits``)."""
    cb = MemWatchCallback(workers=False)
    cb.trainer = _UserTrainer()
    vars(cb)  # noqa: B018
    cb.trainer.train_logits.extend(torch.ones(2) for _ in range(20))
    h, why = H.walk(cb.trainer.train_logits[5])
    assert h is None and why == H.OWN, h


EVAL_LOGITS: list[Any] = []  # a compute_metrics that keeps p.predictions


class _EvalPrediction:
    """A framework's record of predictions (transformers' EvalPrediction is a plain class in a
    library's module; this one stands in from this module, so it is marked as a library's)."""

    def __init__(self, predictions: Any) -> None:
        self.predictions = predictions


_EvalPrediction.__module__ = "transformers.trainer_utils"


def _walk_from(obj_id: int, arrays: ArrayBases | None = None) -> tuple[Any, str]:
    return H.walk(H.objects_by_ids({obj_id})[obj_id], arrays=arrays)


def test_numpy_arrays_over_a_tensor_are_followed_to_the_users_list() -> None:
    """``tensor.numpy()`` makes an array the collector does not track, whose base keeps the
    tensor: the walk from the tensor reaches the array, then the user's list that keeps it."""
    t = torch.zeros(32, 64)
    EVAL_LOGITS.append(t.numpy())
    base_id = id(EVAL_LOGITS[-1].base)
    del t
    # (never bound to a local of this frame, which would hold it: _walk_from fetches it)
    assert _walk_from(base_id) == (None, H.NO_REFERRER)  # without the arrays: a dead end
    idx = ArrayBases()
    try:
        h, _ = _walk_from(base_id, idx)
    finally:
        idx.close()
    assert h is not None and h.path.endswith("EVAL_LOGITS"), h
    assert h.name == "EVAL_LOGITS" and h.elements == "numpy arrays"
    EVAL_LOGITS.clear()


def test_a_frameworks_record_is_passed_through_to_the_users_container() -> None:
    arr = np.zeros(1000)
    record = _EvalPrediction(arr)
    EVAL_LOGITS.append(arr)
    h = H.holder_of(EVAL_LOGITS[-1])
    assert h is not None and h.path.endswith("EVAL_LOGITS"), h
    # the framework's record alone still names something
    only = _EvalPrediction(np.ones(10))
    h = H.holder_of(only.predictions)
    assert h is not None and h.path.endswith("only.predictions"), h
    EVAL_LOGITS.clear()
    del record


_MODEL = torch.nn.Linear(8, 8)


@functools.lru_cache(maxsize=4096)
def adapter_for(model: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    """Keyed on the model and the step: every call is a new entry (the cache never hits; its
    bound is far above what a run fills)."""
    return {"A": torch.randn(64, 8), "B": torch.randn(8, 64)}


def test_a_functools_cache_is_the_holder_named_by_its_function() -> None:
    prev = C.take_census()
    for step in range(80):
        adapter_for(_MODEL, step)
    cur = C.take_census()
    a = _attribute(prev, cur, steps=80)
    h = a.holder
    assert h is not None and h.container == "lru_cache" and h.name == "adapter_for", h
    assert h.owner_delta == 80, h  # the cache is recorded by its entries: it grew by 80
    culprit, suggestions, _ = culprit_of("host.rss", a)
    assert "adapter_for" in culprit and "cache" in culprit
    assert "adapter_for.cache_clear()" in suggestions[0] and "maxsize" in suggestions[0]
    adapter_for.cache_clear()


class _Processor:
    def __init__(self) -> None:
        self.last_step_result: dict[int, torch.Tensor] = {}


def test_the_fix_names_the_growing_container_not_the_route() -> None:
    """A closure's variable keeps a processor whose dict grows: the fix says
    ``processor.last_step_result``, the whole route stays in the evidence."""
    processor = _Processor()

    def train() -> _Processor:
        return processor

    prev = C.take_census()
    for i in range(40):
        processor.last_step_result[i] = torch.ones(128, 64)
    cur = C.take_census()
    a = _attribute(prev, cur, steps=40)
    _, suggestions, _ = culprit_of("host.rss", a)
    assert a.holder is not None and a.holder.name == "processor.last_step_result", a.holder
    assert suggestions[0].startswith("`processor.last_step_result` is a cache"), suggestions
    assert a.evidence()["holder"] == a.holder.path and "last_step_result" in a.holder.path
    del train


_NODES: list[Any] = []  # autograd nodes kept: their saved inputs are held from C++ only


def test_a_shape_alone_says_why_no_holder_was_named() -> None:
    """Tensors kept only as the saved inputs of kept autograd nodes: nothing in Python refers
    to them, so no holder can be named. The culprit is their shape *with why*, and no advice
    points at a bundle that does not exist (``memwatch inspect`` only after ``mw.dump``)."""
    w = torch.ones(1024, requires_grad=True)
    prev = C.take_census()
    for _ in range(12):  # (fewer than a recorded container's 16: the list is not a candidate)
        _NODES.append((torch.randn(256, 1024) * w).grad_fn)
    cur = C.take_census()
    a = _attribute(prev, cur, steps=12)
    culprit, suggestions, _ = culprit_of("host.rss", a)
    assert a.holder is None and a.holder_note is not None, a.holder
    assert "float32[256x1024]" in str(culprit), culprit
    assert "(no holder named: nothing in Python refers to these objects" in str(culprit)
    assert a.evidence()["holder_note"] == a.holder_note
    for s in suggestions:
        assert "memwatch inspect" not in s or "mw.dump(" in s, s
    _NODES.clear()


def test_every_module_of_memwatch_is_its_own_file() -> None:
    """OWN_DIR is the whole package, not the folder the ownership module sits in (it moved two
    levels down in a reshape, and the timeline's and the session's files became 'user code' that
    tracemalloc named as a leak's allocation site)."""
    import memwatch
    import memwatch.session.session
    import memwatch.timeline.store
    from memwatch.analysis.culprits.census import ownership

    assert ownership.OWN_DIR == os.path.dirname(os.path.abspath(memwatch.__file__)) + os.sep
    for mod in (memwatch.timeline.store, memwatch.session.session, memwatch):
        assert ownership.is_own_file(os.path.abspath(mod.__file__ or "")), mod
        assert not ownership.is_user_file(os.path.abspath(mod.__file__ or "")), mod


_TRIALS: list[torch.optim.Optimizer] = []  # a search that keeps every trial's optimizer


def _trial() -> None:
    model = torch.nn.Linear(256, 256, bias=False)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 256)).sum().backward()
    opt.step()
    _TRIALS.append(opt)


def _grad_holder() -> object:
    return H.find_holder(id(_TRIALS[-1].param_groups[0]["params"][0].grad))


def test_a_group_is_named_from_another_of_its_objects_where_one_has_no_python_referrer() -> None:
    """accelerate#84's shape: each trial keeps its weight's ``.grad`` (held in C++: nothing in
    Python refers to it) and Adam's two moments, one group of three tensors of one shape a
    trial. Where the walk starts from a gradient, it tries another of the group: the group is
    named by the list of optimizers, not dropped for the next group (the weights)."""
    _TRIALS.clear()
    for _ in range(2):
        _trial()
    prev = C.take_census()
    for _ in range(6):
        _trial()
    cur = C.take_census()
    # The mechanism: nothing in Python refers to a parameter's .grad (its walk names nothing).
    assert _grad_holder() is None
    grads = {id(p.grad) for o in _TRIALS for g in o.param_groups for p in g["params"]}
    (key,) = [k for k, g in cur.groups.items() if g.shape == (256, 256) and not g.requires_grad]
    group = cur.groups[key]
    assert grads <= set(group.ids)  # the gradients are of the moments' group
    # The walk starts from the middle of what the group gained: a gradient, here.
    others = [i for i in group.ids if i not in grads]
    group.ids[:] = others[:len(others) // 2] + sorted(grads) + others[len(others) // 2:]
    a = _attribute(prev, cur)
    assert a.group is not None and a.group.group.shape == (256, 256) and \
        not a.group.group.requires_grad, a.group
    assert a.holder is not None and "_TRIALS" in a.holder.path, a.holder
    _TRIALS.clear()


#: 16 shapes of about 4 MiB each (float32); the last 8 a row longer, so that no new storage has
#: the size of an evicted one (the allocator may hand out the same address again, which the
#: census reads as a view of a storage it had counted: not this test's question). Megabytes
#: that the rest of the process frees or takes between the censuses (other tests' objects)
#: stay small beside the 32 MiB rotated.
_SHAPES = [(2**i, 2**(20 - i) + (i >= 8)) for i in range(16)]


@functools.lru_cache(maxsize=8)
def _mask_for(i: int) -> torch.Tensor:
    """A cache keyed by a shape (a sequence length, a crop), at its bound after 8 keys."""
    return torch.zeros(_SHAPES[i])


def test_a_full_cache_rotating_entries_of_other_shapes_explains_no_growth() -> None:
    """Between the censuses the full cache replaced its 8 entries with 8 of other shapes: the
    groups that gained (32 MiB, by shape) lost about as much in others. Live tensors added nothing,
    so they explain none of RSS's growth: the verdict is the allocator's evidence to give
    (retention), not a leak named on a cache that cannot grow."""
    for i in range(8):
        _mask_for(i)
    prev = C.take_census(collect=True)  # (earlier tests' garbage gone before either census)
    for i in range(8, 16):
        _mask_for(i)
    cur = C.take_census(collect=True)
    try:
        assert _mask_for.cache_info().currsize == 8
        gained = sum(g.effective_bytes for g in C.diff(prev, cur, "cpu")
                     if g.group.shape in _SHAPES)
        assert gained >= 24 * 2**20  # each new shape is a group that grew (by 4 MiB)
        assert abs(C.net_growth(prev, cur, "cpu")) < 4 * 2**20
        pair = (CensusRecord(0, prev, 0.0, step=0), CensusRecord(1, cur, 0.0, step=64))
        stats: Any = types.SimpleNamespace(n_steps=64)
        a = attribution.attribute("host.rss", stats, pair, CheckContext(), AnalyzerConfig(),
                                  growth=64 * 2**20)
        assert (a.explained_bytes or 0) < 4 * 2**20, a.explained_bytes
        assert a.retention
    finally:
        _mask_for.cache_clear()
