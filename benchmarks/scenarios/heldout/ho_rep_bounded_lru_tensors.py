"""Reported non-leak: an ``lru_cache`` keyed by tensors fills to its bound, then only evicts.

Thread: https://github.com/pytorch/pytorch/pull/112301 ("Memory leak from
bsr_scatter_mm_indices_data argument cache", merged), following pytorch#112076. PyTorch's
block-sparse matmul caches the scatter indices it derives from a sparsity pattern with
``functools.lru_cache(maxsize=128)``, keyed by the index tensors (wrapped as ``TensorAsKey``)
and holding index tensors as values. Tests that check for leaks flagged it: memory stayed
allocated after each call. The thread's conclusion is that the cache is what holds the memory and
that it is bounded (up to 128 entries, evicted least-recently-used); it made the tests *look*
leaky, so the tests clear the cache. Nothing grows past the bound.

Reproduction: dynamic sparse training: every step re-samples the block mask of a block-sparse
layer (a new ``crow_indices``/``col_indices`` pattern), and the layer asks the cached helper for
the scatter indices of that pattern (int64 tensors, ~256 KB per entry). Every call is a miss, so
the cache gains one entry per step until it holds 128, in the first epoch, and stays at 128 from
then on. A correct verdict is a plateau (bounded), not a leak. Twin:
``ho_fix_bounded_lru_tensors`` (the indices computed per call, no cache).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, HIDDEN, IN_DIM, Data, epochs_loop

SOURCE = "https://github.com/pytorch/pytorch/pull/112301"
BLOCK = 16
DENSITY = 0.25
CACHE_SIZE = 128

SCENARIO = Scenario(
    name="ho_rep_bounded_lru_tensors",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#112301: lru_cache(maxsize=128) of tensor-keyed scatter indices, bounded",
    expected_kind="bounded",
    source=SOURCE,
    split="heldout",
    reported=True,
)


class TensorAsKey:
    """A hashable stand-in for a tensor, by its storage and shape (as ``torch.sparse``'s)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.obj = t
        self.key = (t.data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorAsKey) and self.key == other.key


def _scatter_indices(m: int, k: int, crow: TensorAsKey,
                     col: TensorAsKey) -> tuple[torch.Tensor, torch.Tensor]:
    """Per nonzero block: the dense rows and columns it covers (what the matmul scatters)."""
    crow_t, col_t = crow.obj, col.obj
    rows = torch.repeat_interleave(torch.arange(m // BLOCK), crow_t.diff())
    offs = torch.arange(BLOCK)
    r = (rows[:, None] * BLOCK + offs[None, :]).repeat_interleave(BLOCK, dim=1)
    c = (col_t[:, None] * BLOCK + offs[None, :]).repeat(1, BLOCK)
    return r.flatten(), c.flatten()


cached_scatter_indices = functools.lru_cache(maxsize=CACHE_SIZE)(_scatter_indices)


class DynamicBlockSparseLinear(nn.Module):
    """A linear layer whose weight keeps only the blocks of a mask re-sampled every step."""

    def __init__(self, fan_in: int, fan_out: int, cached: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_out, fan_in) / fan_in ** 0.5)
        self.cached = cached
        self.g = torch.Generator().manual_seed(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mb, kb = self.weight.shape[0] // BLOCK, self.weight.shape[1] // BLOCK
        mask = torch.rand(mb, kb, generator=self.g) < DENSITY
        sparse = mask.to_sparse_csr()
        crow, col = sparse.crow_indices(), sparse.col_indices()
        get = cached_scatter_indices if self.cached else _scatter_indices
        r, c = get(self.weight.shape[0], self.weight.shape[1], TensorAsKey(crow),
                   TensorAsKey(col))
        dense_mask = torch.zeros_like(self.weight, dtype=torch.bool)
        dense_mask[r, c] = True
        return x @ (self.weight * dense_mask).t()


def _run(mw: Any, epochs: int, steps_per_epoch: int, cached: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    cached_scatter_indices.cache_clear()
    model = nn.Sequential(DynamicBlockSparseLinear(IN_DIM, HIDDEN, cached), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = Data()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch(BATCH)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, cached=True)
