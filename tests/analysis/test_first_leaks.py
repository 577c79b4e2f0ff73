"""A new user's first own leak is named by its holder at the second check (issue 23): a plain
dict, list or deque gaining 1 MiB of numpy arrays, bytes, strings or tensors every step, held by
a module global, a local of the running function or an attribute. The name is the container
that grows (never an element's index or key) and it is the same at every check; a container of
per-step dicts or lists is counted by what it gained, not by the size of its newest element."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loop_runs import LoopRuns

run_loop = LoopRuns(Path(__file__).with_name("first_leak_loops.py"))

#: mode -> what the culprit must start with (the holder's name) and what it holds.
LEAKS = {
    "dict_numpy": ("first_leak_loops.STORE (dict, ", "numpy arrays"),
    "dict_bytes_local": ("main() (first_leak_loops.py:", "local local_store (dict, "),
    "dict_str_attr": ("main() (first_leak_loops.py:", "local probe.seen (dict, "),
    "deque_tensor": ("first_leak_loops.HISTORY (deque, ", "tensors"),
    "list_str": ("first_leak_loops.OUTPUTS (list, ", "strings"),
    "dict_of_dicts": ("first_leak_loops.GRAD_DEBUG (dict, ", "dicts"),
    "dict_of_lists": ("first_leak_loops.GRAD_DEBUG (dict, ", "lists"),
}


def leaks(epoch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in epoch if f["kind"] == "leak"]


@pytest.mark.parametrize("mode", sorted(LEAKS))
def test_named_by_its_holder_at_the_second_check(mode: str, tmp_path: Path) -> None:
    epochs = run_loop(mode, tmp_path)
    assert leaks(epochs[0]) == []  # one check cannot tell a leak from epoch-scoped growth
    names = []
    for e in epochs[1:]:
        (f,) = leaks(e)
        assert f["metric"] == "host.rss", f
        start, holds = LEAKS[mode]
        assert f["culprit"].startswith(start) and holds in f["culprit"], f["culprit"]
        # Counted by what the owner gained: 40 elements of 1 MiB since the last check.
        assert "+40 since the last check" in f["culprit"], f["culprit"]
        names.append(f["culprit"].split(" — ")[0].rsplit(" (", 1)[0])
        assert "[" not in names[-1], names[-1]  # never an element's index or key
    assert len(set(names)) == 1  # the same name at every check


def test_a_bounded_twin_is_quiet(tmp_path: Path) -> None:
    epochs = run_loop("dict_numpy_bounded", tmp_path)
    assert [f for e in epochs for f in e if f["kind"] in ("leak", "allocator_retention")] == []
