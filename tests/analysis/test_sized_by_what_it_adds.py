"""Issue 41: a culprit is sized by what it adds. Views count their bases once, by the bases'
identity (the storage for tensors, the owning array for numpy), and not at all when the
program keeps those bases anyway; an autograd graph's saved tensors are counted only while
they are alive."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.census import graphs as G
from memwatch.analysis.culprits.growth import weigh as W
from memwatch.analysis.evidence import ContainerGrowth

MiB = 2**20


def _added(kept: list[Any], new: int) -> float:
    g = ContainerGrowth(id(kept), "list", len(kept), new, False)
    s = W.Scale()
    try:
        W.weigh_growth(g, kept, s)
    finally:
        s.close()
    return g.bytes_delta


def _views_over(make_base: Any, bases: int, views: int) -> list[Any]:
    kept: list[Any] = []
    for _ in range(bases):
        base = make_base()
        kept.extend(base[i:i + 10] for i in range(views))
    return kept


def test_views_over_shared_bases_count_each_base_once() -> None:
    """400 views over 4 bases of 8 MiB add 32 MiB, however the 16 weighed ones are spread
    (each weighed as if it owned its base and scaled to 400, they weighed 200 MiB)."""
    for make in (lambda: np.zeros(MiB),  # numpy views of an array
                 lambda: torch.zeros(2 * MiB),  # torch views of a storage
                 lambda: torch.zeros(2 * MiB).numpy()):  # numpy views over a tensor's storage
        kept = _views_over(make, bases=4, views=100)
        assert 32 * MiB <= _added(kept, 400) <= 33 * MiB, make


def test_views_of_a_base_the_program_keeps_anyway_add_nothing() -> None:
    held_np, held_t = np.zeros(MiB), torch.zeros(2 * MiB)
    kept = [held_np[i:i + 10] for i in range(200)] + [held_t[i:i + 10] for i in range(200)]
    assert _added(kept, 400) < MiB  # the views' own headers, not the 16 MiB of bases


def test_arrays_of_their_own_still_weigh_each() -> None:
    kept = [np.zeros(16384) for _ in range(400)]  # 128 KiB each
    assert 50 * MiB <= _added(kept, 400) <= 51 * MiB
    records = {i: (torch.zeros(32768), f"step {i}") for i in range(400)}  # 128 KiB each
    g = ContainerGrowth(id(records), "dict", 400, 400, False)
    s = W.Scale()
    W.weigh_growth(g, records, s)
    s.close()
    assert 50 * MiB <= g.bytes_delta <= 51 * MiB


def test_views_of_a_storage_an_earlier_census_counted_add_nothing() -> None:
    """The census's groups: new views of a large storage that was there at the previous census
    take its bytes from the base's group, and add none to their own group's growth."""
    base = torch.zeros(4 * MiB)  # 16 MiB, counted by its own group at the first census
    c0 = C.take_census()
    views = [base.view(-1)[i:i + 7] for i in range(50)]
    c1 = C.take_census()
    grown = {g.group.shape: g for g in C.diff(c0, c1, "cpu")}
    assert grown[(7,)].count_delta >= 50
    assert grown[(7,)].bytes_delta < MiB, grown[(7,)]  # not the base's 16 MiB
    # views of a storage made since are what keeps it: counted
    fresh = [torch.zeros(4 * MiB).view(-1)[:7]]
    c2 = C.take_census()
    grown = {g.group.shape: g for g in C.diff(c1, c2, "cpu")}
    assert grown[(7,)].bytes_delta >= 16 * MiB
    del views, fresh


def test_a_kept_output_holds_its_saved_tensors_only_until_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    x = torch.randn(64, 256)
    kept = [model(x) for _ in range(3)]  # three forward passes kept, backward not run
    before = C.take_census().groups[("cpu", "torch.float32", (64, 256), True, "AddmmBackward0")]
    assert before.graph_saved >= 3 * 3 * 64 * 256 * 4  # the activations each graph saved
    for out in kept:
        out.sum().backward()
    after = C.take_census().groups[("cpu", "torch.float32", (64, 256), True, "AddmmBackward0")]
    assert after.graph_nodes == before.graph_nodes  # the nodes are still held ...
    assert after.graph_saved == 0  # ... their saved tensors are not
    assert after.graph_bytes == after.graph_nodes * G.NODE_BYTES < before.graph_bytes
    del kept
