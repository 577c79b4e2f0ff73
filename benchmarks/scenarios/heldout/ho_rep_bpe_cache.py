"""Reported leak: a BPE tokenizer's word cache, a plain dict of strings that is never flushed.

Thread: https://github.com/EleutherAI/gpt-neox/pull/383 ("Use lru_cache for GPT2Tokenizer.bpe",
merged), the same finding as huggingface/transformers#2827 ("OOM risk in
RobertaTokenizer/GPT2Tokenizer"). ``GPT2Tokenizer.bpe`` memoizes every word it splits in
``self.cache``, a dict that is never flushed: on a long stream of text with many distinct words
(identifiers, numbers, rare names) it grew to millions of entries and exhausted the RAM; the
merged fix bounds it with an LRU cache.

Reproduction: a text classifier trains on a stream of log lines tokenized on the fly, each line
carrying a few words never seen before (request ids, hashes, counters), as such streams do. The
tokenizer (our own byte-pair merge loop over a small merge table, with the report's unbounded
``cache``: word -> space-joined pieces) gains a few hundred entries per step, all plain ``str``
keys and values; no tensor is kept. The holder is ``tokenizer.cache``. Fixed twin:
``ho_fix_bpe_cache`` (the word split memoized by a bounded LRU cache).
"""

from __future__ import annotations

import functools
import random
import string
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, CLASSES, HIDDEN, epochs_loop

SOURCE = "https://github.com/EleutherAI/gpt-neox/pull/383"
VOCAB = 4096
NEW_WORDS_PER_LINE = 4
LRU_SIZE = 1024

SCENARIO = Scenario(
    name="ho_rep_bpe_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="tokenizer.cache",
    description="gpt-neox#383 / transformers#2827: BPE tokenizer's unbounded word cache (str dict)",
    # Measured with tracemalloc (small str objects live in pymalloc's arenas, outside glibc's
    # count; reported/README.md): 256 new words per step, each a key and a value str and a slot.
    planted_bytes_per_step=49_600,
    source=SOURCE,
    split="heldout",
    reported=True,
)


def _merge_ranks() -> dict[tuple[str, str], int]:
    """A small merge table: frequent letter and digit pairs, then a few longer pieces."""
    alphabet = string.ascii_lowercase + string.digits
    rng = random.Random(0)
    pairs = [(a, b) for a in alphabet for b in alphabet]
    rng.shuffle(pairs)
    ranks = {p: i for i, p in enumerate(pairs[:600])}
    for i, (a, b) in enumerate(pairs[:200]):
        ranks[(a + b, rng.choice(alphabet))] = 600 + i
    return ranks


class BPETokenizer:
    """Byte-pair splitting of each word, memoized per word as in the report."""

    def __init__(self, bounded: bool) -> None:
        self.bpe_ranks = _merge_ranks()
        self.cache: dict[str, str] = {}
        self.split: Callable[[str], str] = (
            functools.lru_cache(maxsize=LRU_SIZE)(self._split) if bounded else self.bpe)

    def bpe(self, word: str) -> str:
        if word in self.cache:
            return self.cache[word]
        pieces = self._split(word)
        self.cache[word] = pieces  # never flushed: the leak
        return pieces

    def _split(self, word: str) -> str:
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.bpe_ranks.get((a, b), -1), k)
                      for k, (a, b) in enumerate(zip(parts, parts[1:], strict=False))]
            ranked = [(r, k) for r, k in ranked if r >= 0]
            if not ranked:
                break
            _, k = min(ranked)
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        return " ".join(parts)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in text.split():
            ids.extend(hash(piece) % VOCAB for piece in self.split(word).split(" "))
        return ids


class LogStream:
    """Log lines: a few common words plus identifiers that never repeat."""

    COMMON = ("request", "served", "user", "error", "cache", "miss", "retry", "ok", "latency",
              "shard", "token", "session")

    def __init__(self) -> None:
        self.rng = random.Random(1)
        self.n = 0

    def line(self) -> tuple[str, int]:
        words = [self.rng.choice(self.COMMON) for _ in range(6)]
        for _ in range(NEW_WORDS_PER_LINE):
            self.n += 1
            words.append(f"{self.rng.getrandbits(64):016x}{self.n}")
        label = self.n % CLASSES
        return " ".join(words), label


tokenizer: BPETokenizer | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, bounded: bool) -> list[list[Any]]:
    global tokenizer
    torch.manual_seed(0)
    tokenizer = tok = BPETokenizer(bounded)
    stream = LogStream()
    model = nn.Sequential(nn.EmbeddingBag(VOCAB, HIDDEN, mode="mean"), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(epoch: int, i: int) -> None:
        ids: list[int] = []
        offsets: list[int] = []
        labels: list[int] = []
        for _ in range(BATCH):
            text, label = stream.line()
            offsets.append(len(ids))
            ids.extend(tok.encode(text))
            labels.append(label)
        opt.zero_grad(set_to_none=True)
        out = model[2](model[1](model[0](torch.tensor(ids), torch.tensor(offsets))))
        nn.functional.cross_entropy(out, torch.tensor(labels)).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, bounded=False)
