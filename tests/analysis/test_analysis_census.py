"""Tensor census and holder naming, on objects whose holders are known."""

from __future__ import annotations

import collections
from typing import Any

import torch

from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.census import graphs as G
from memwatch.analysis.culprits.holders import holders as H

GLOBAL_HISTORY: list[torch.Tensor] = []


def _holder_of(t: torch.Tensor) -> H.Holder:
    h = H.find_holder(id(t))
    assert h is not None
    return h


def test_census_groups_and_deduplicates_views() -> None:
    base = torch.zeros(1024)  # 4 KiB storage
    views = [base[:512], base[512:]]
    c = C.take_census()
    g = c.groups[("cpu", "torch.float32", (512,), False, "")]
    assert g.count >= 2
    # the views share base's storage: its bytes are counted once, not per view
    assert c.tensor_bytes["cpu"] >= 4096
    assert sum(x.bytes for k, x in c.groups.items() if k[2] == (512,)) < 4096 * 2
    del views


def test_diff_names_growing_group() -> None:
    keep: list[torch.Tensor] = []
    c0 = C.take_census()
    keep.extend(torch.ones(7, 13) for _ in range(20))
    c1 = C.take_census()
    growth = C.diff(c0, c1, "cpu")
    top = [g for g in growth if g.group.shape == (7, 13)]
    assert top and top[0].count_delta == 20
    assert top[0].bytes_delta == 20 * 7 * 13 * 4
    assert len(top[0].new_ids) == 20


def test_holder_module_global() -> None:
    GLOBAL_HISTORY.append(torch.ones(3, 3))
    h = _holder_of(GLOBAL_HISTORY[-1])
    assert h.root == "global"
    # ``module.name``, no element index; the container described by its type and size
    assert h.path == "test_analysis_census.GLOBAL_HISTORY"
    assert h.container == "list" and h.elements == "tensors"
    assert h.describe(1) == (f"test_analysis_census.GLOBAL_HISTORY (list, "
                             f"{len(GLOBAL_HISTORY)} tensors, +1 since the last check)")


class Trainer:
    def __init__(self) -> None:
        self.cache: dict[int, torch.Tensor] = {}


def test_holder_attribute_dict_cache() -> None:
    tr = Trainer()
    tr.cache[7] = torch.ones(2, 2)
    holder = {"trainer": tr}  # noqa: F841 - keeps tr reachable from a local only
    h = _holder_of(tr.cache[7])
    # a cache's key (an int) says nothing: the attribute is the name
    assert h.path.endswith("Trainer.cache") or h.path.endswith(".cache"), h.path
    assert "[7]" not in h.path
    assert h.container == "dict" and h.container_len == 1


def test_holder_hook_closure() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    store: list[torch.Tensor] = []

    def make(store: list[torch.Tensor]) -> Any:
        def hook(m: Any, i: Any, o: torch.Tensor) -> None:
            store.append(o)
        return hook

    for _ in range(3):
        model[0].register_forward_hook(make(store))
    model(torch.ones(1, 4))
    first = store[0]
    del store  # only the hooks' closures hold the list now
    h = _holder_of(first)
    assert h.via_hook and h.hook_count == 3
    assert "_forward_hooks" in h.path and "closure variable `store`" in h.path


def test_holder_stored_traceback_frame() -> None:
    errors: list[BaseException] = []

    def step() -> None:
        big = torch.ones(5, 5) * 2  # noqa: F841 - held by the frame the traceback keeps
        raise ValueError("boom")

    try:
        step()
    except ValueError as e:
        errors.append(e)
    tb = errors[0].__traceback__
    assert tb is not None and tb.tb_next is not None
    t = tb.tb_next.tb_frame.f_locals["big"]
    h = _holder_of(t)
    del t
    assert h.via_traceback
    assert "step() (test_analysis_census.py:" in h.path and ": local big" in h.path
    assert "__traceback__" in h.path


def test_holder_bounded_deque_is_named_too() -> None:
    recent: collections.deque[torch.Tensor] = collections.deque(maxlen=4)
    recent.append(torch.ones(1))
    holder = [recent]  # noqa: F841
    h = _holder_of(recent[0])
    # named at the outermost container below the name: a list of one deque
    assert h.path.endswith(": local holder"), h.path
    assert (h.container, h.container_len, h.elements) == ("list", 1, "deques")


def test_graph_bytes_of_a_tensor_kept_with_its_graph() -> None:
    lin = torch.nn.Linear(64, 256)
    out = torch.relu(lin(torch.randn(32, 64))).sum()
    held, nodes = G.graph_size(out)
    assert nodes >= 3
    assert held >= 32 * 256 * 4  # relu's saved result at least


def test_tensor_census_json_shape() -> None:
    keep = torch.ones(100, 100)  # noqa: F841
    d = C.tensor_census(top_n=5)
    assert d["tensors_scanned"] > 0 and len(d["groups"]) <= 5
    assert {"device", "dtype", "shape", "count", "bytes"} <= set(d["groups"][0])


def test_holder_local_of_a_running_function() -> None:
    """The training loop that calls end_epoch() is still running: its locals are holders too."""
    val_outputs = [torch.ones(4, 4) for _ in range(3)]
    tid = id(val_outputs[1])
    h = H.find_holder(tid)
    assert h is not None
    assert h.path.startswith("test_holder_local_of_a_running_function() (test_analysis_census.py:")
    assert h.path.endswith(": local val_outputs"), h.path
    assert h.root == "frame"
    assert (h.container, h.container_len, h.elements) == ("list", 3, "tensors")


class _Marker:
    """A class of this test's own: its instances are counted by name, exactly."""


def test_census_records_containers_from_their_minimum_length_and_counts_every_type() -> None:
    """Containers are chosen by length at C speed, a slice of the heap at a time: the ones
    exactly at the minimum are in, one shorter are out, for each container kind; type counts
    add up over the slices (more objects than one slice holds)."""
    from memwatch.analysis.culprits.census import containers

    seq, other = containers.SEQUENCE_MIN_LEN, containers.CONTAINER_MIN_LEN
    keep = {
        "list_at": list(range(seq)), "list_below": list(range(seq - 1)),
        "deque_at": collections.deque(range(seq)),
        "deque_below": collections.deque(range(seq - 1)),
        # (values the collector tracks: a dict of atoms is not tracked, so not listed)
        "dict_at": {i: [i] for i in range(other)},
        "dict_below": {i: [i] for i in range(other - 1)},
        "set_at": set(range(other)), "set_below": set(range(other - 1)),
        "od_at": collections.OrderedDict((i, [i]) for i in range(other)),
    }
    markers = [_Marker() for _ in range(3 * C._CHUNK)]
    c = C.take_census()
    for name, obj in keep.items():
        assert (id(obj) in c.containers) == name.endswith("_at"), name
        if name.endswith("_at"):
            assert c.containers[id(obj)][0] == len(obj)
    assert c.containers[id(keep["deque_at"])][1] == "deque"
    assert c.containers[id(keep["od_at"])][1] == "dict"
    assert c.types[_Marker.__qualname__] == len(markers)
    assert id(markers) in c.containers
    untyped = C.take_census(count_types=False)
    assert not untyped.types and id(keep["list_at"]) in untyped.containers


def test_module_paths_are_judged_after_normalising_only_what_could_move_them() -> None:
    """A module path that is absolute and normal is judged as it is (a first census asks about
    3,000 of them); one with a "." or ".." part or a doubled separator is normalised first, so
    that a path that climbs out of an installed package is not taken for the package's."""
    import json
    import os

    from memwatch.analysis.culprits.census import ownership

    ownership._is_user_path.cache_clear()
    lib = os.path.dirname(json.__file__)
    assert not ownership._is_user_path(json.__file__)
    assert ownership._is_user_path(__file__)
    # out of the standard library by "..", and back into it by "." and "//"
    climbed = f"{lib}/../../../../../{os.path.abspath(__file__).lstrip('/')}"
    assert ownership._is_user_path(climbed)
    assert not ownership._is_user_path(f"{lib}/./__init__.py")
    assert not ownership._is_user_path(f"{lib}//__init__.py")
    fake_pkg = "/opt/venv/lib/python3.11/site-packages/../../../../../home/u/train.py"
    assert ownership._is_user_path(fake_pkg)
