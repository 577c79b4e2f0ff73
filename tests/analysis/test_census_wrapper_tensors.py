"""The tensor census beside wrapper tensor subclasses (issue 45): FSDP2's sharded parameters and
their Adam state are ``DTensor``s, wrappers whose storage cannot be read ("Attempted to access the
data pointer on an invalid python storage") and whose bytes are their local tensor's. A census
that met one failed whole ("tensor census failed ...; culprits will not be named"), so a leak in
a sharded run was never named. The wrapper here is made the way DTensor is
(``torch.Tensor._make_wrapper_subclass``, an inner local tensor)."""

from __future__ import annotations

from typing import Any

import torch

from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.census import graphs as G


class Wrapper(torch.Tensor):
    """A tensor subclass with no storage of its own, holding its data in ``local``."""

    local: torch.Tensor

    @staticmethod
    def __new__(cls, local: torch.Tensor) -> Wrapper:
        w = torch.Tensor._make_wrapper_subclass(cls, local.shape, dtype=local.dtype)
        w.local = local
        return w  # type: ignore[no-any-return]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(f"{func} on a test wrapper")


SHARDS: list[Wrapper] = []


def test_wrappers_have_no_own_storage_and_do_not_stop_the_census() -> None:
    w = Wrapper(torch.ones(3, 5))
    assert G.own_storage(w) is None and G.own_storage(w.local) is not None
    assert G.own_storage("not a tensor") is None
    c0 = C.take_census()
    SHARDS.extend(Wrapper(torch.full((9, 11), float(i))) for i in range(12))
    c1 = C.take_census()  # raised RuntimeError before
    wrappers = c1.groups[("cpu", "torch.float32", (9, 11), False, "")]
    assert wrappers.count >= 24  # 12 wrappers and their 12 local tensors: one shape
    # each local tensor's bytes once; the wrappers add none of their own
    assert wrappers.bytes == 12 * 9 * 11 * 4
    growth = [g for g in C.diff(c0, c1, "cpu") if g.group.shape == (9, 11)]
    assert growth and growth[0].bytes_delta == 12 * 9 * 11 * 4
    SHARDS.clear()
