"""Every reader survives fuzzing: a result or the documented refusal, in bounded time and memory.

Property-based (Hypothesis) tests, one per reader: the bundle reader (manifest and documents,
``timeline.jsonl``, and everything that renders a bundle: ``summarize``, the terminal summary, the
HTML report, the job comparison), the black-box record reader, the restricted unpickler of
snapshots, and the export reader of ``JsonlSink`` logs (with rotated files), CSV exports and JSON
exports (``timeline.json``). Each example starts from REAL artefacts of tiny real sessions
(``tests/fuzz_artefacts.py``) and mutates them as Hypothesis chooses: a value of another type, a
huge or non-finite number, a deep nest, invalid UTF-8 or a lone surrogate, a cut, or a symlink
(to ``/dev/zero``, outside, inside), a FIFO, a directory or a sparse 8 GiB file where a file
should be. The only outcomes allowed are a result or the documented refusal
(:class:`memwatch.core.errors.BundleError`, ``MemwatchError`` for exports, a one-line
``ValueError`` naming a black-box record), each example within :data:`EXAMPLE_S` seconds and
:data:`EXAMPLE_BYTES` of memory (``tracemalloc``'s peak, in a quarter of the examples:
tracing makes one four times slower).

The same inputs then go through the command line in this process (``memwatch inspect``, ``ls``,
``report``): exit code 0, or 2 with one line; and never the CLI's last resort ("malformed
input ... please report this", counted in :data:`memwatch.cli.CAUGHT_MALFORMED`).

Deterministic: ``derandomize=True``, no example database, and a budget of :data:`BUDGET_S`
CPU seconds per reader (the run ends there, after :data:`MIN_EXAMPLES` at least: a slow machine
runs a shorter prefix of the same sequence; ``MEMWATCH_FUZZ_BUDGET_S`` changes it). CPU time of
this thread, where the readers and the CLI run: a machine loaded by other jobs runs the same
examples, only later.
``benchmarks/bench_fuzz_readers.py`` runs the same cases for longer, from seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from fuzz_artefacts import (
    KEYS,
    READERS,
    VALUES,
    Artefacts,
    cli_commands,
    make_artefacts,
    make_case,
    read,
    run_cli,
)

#: CPU seconds of examples per reader (the whole suite: about six times this). 4 CPU s are the
#: examples that 6 s of wall time ran on a quiet machine (29 CPU s for the six readers).
BUDGET_S = float(os.environ.get("MEMWATCH_FUZZ_BUDGET_S", "4"))
#: Most examples per reader (the budget usually ends them first).
MAX_EXAMPLES = 1000
#: Fewest examples per reader, budget or not (the same first ones on any machine).
MIN_EXAMPLES = 25
#: Most CPU seconds one example may take (reading, rendering and the CLI).
EXAMPLE_S = 20.0
#: Most memory one example may allocate at its peak (its inputs are tens of KiB).
EXAMPLE_BYTES = 256 << 20

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(),
                                                                      max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(), max_size=8) | st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12)
_VALUE = st.one_of(st.sampled_from(VALUES), _json,
                   st.integers(min_value=-10**450, max_value=10**450))


class _Choices:
    """A :class:`fuzz_artefacts.Chooser` drawing from Hypothesis (which shrinks a failure)."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def choice(self, seq: Any) -> Any:
        return self.data.draw(st.sampled_from(list(seq)))

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def chance(self, percent: int) -> bool:
        # Hypothesis draws small integers first and shrinks towards 0: 0 is "no".
        return self.data.draw(st.integers(0, 99)) >= 100 - percent

    def value(self) -> Any:
        return self.data.draw(_VALUE)


class _BudgetSpent(BaseException):
    """Ends a reader's run when its seconds are spent. Not an ``Exception``: Hypothesis lets it
    through (as it does ``KeyboardInterrupt``), not taking it for a failure."""


class _Budget:
    """CPU seconds of examples per reader; once spent, the run ends (unless an example failed:
    Hypothesis then replays and shrinks it, and must see it fail again)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.failed = False
        self.outcomes: Counter[str] = Counter()
        self.slowest = 0.0
        self.peak = 0

    def spent(self) -> bool:
        now = time.thread_time()
        if self.t0 is None:
            self.t0 = now
        return (not self.failed and now - self.t0 > BUDGET_S
                and sum(self.outcomes.values()) >= MIN_EXAMPLES)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Artefacts:
    return make_artefacts(tmp_path_factory.mktemp("real"))


_budgets: dict[str, _Budget] = {}


def _example(reader: str, real: Artefacts, data: st.DataObject) -> None:
    budget = _budgets.setdefault(reader, _Budget())
    budget.spent()  # starts the clock
    try:
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{reader}-") as tmp:
            work = Path(tmp)
            c = _Choices(data)
            target, what = make_case(reader, real, work, c)
            data.draw(st.just(what), label="mutations")
            # The command line too, for a third of the examples of an export (its command
            # renders plotly.js into the page: most of the time of an example).
            cli = c.chance(100 if reader in ("bundle", "record") else 33)
            report = c.chance(15)
            # Memory traced in a quarter of the examples (tracing makes one 4 times slower).
            traced = c.chance(25)
            if traced:
                tracemalloc.start()
            t0 = time.thread_time()
            try:
                outcome = read(reader, target, work)
                for args in cli_commands(reader, target, work, report) if cli else []:
                    rc, _, _ = run_cli(args)
                    outcome += f" {args[0]}:{rc}"
                took = time.thread_time() - t0
                peak = tracemalloc.get_traced_memory()[1] if traced else 0
            finally:
                if traced:
                    tracemalloc.stop()
            assert took < EXAMPLE_S, f"{what}: {took:.1f} s"
            assert peak < EXAMPLE_BYTES, f"{what}: {peak >> 20} MiB at the peak"
            budget.outcomes[outcome.split()[0]] += 1
            budget.slowest = max(budget.slowest, took)
            budget.peak = max(budget.peak, peak)
    except Exception:
        budget.failed = True
        raise
    if budget.spent():  # after a whole example: Hypothesis saw every draw of it
        raise _BudgetSpent


def _settings() -> Any:
    return settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
                    phases=(Phase.explicit, Phase.generate, Phase.shrink),
                    suppress_health_check=list(HealthCheck))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_gives_a_result_or_the_documented_refusal(
        reader: str, real: Artefacts) -> None:
    _budgets.pop(reader, None)

    @_settings()
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        _example(reader, real, data)

    try:
        fuzz()
    except _BudgetSpent:
        pass
    b = _budgets[reader]
    ran = sum(b.outcomes.values())
    took = time.thread_time() - (b.t0 or 0.0)
    print(f"{reader}: {ran} examples in {took:.1f} CPU s, outcomes {dict(b.outcomes)}, slowest "
          f"{b.slowest:.2f} CPU s, peak {b.peak >> 20} MiB (traced in a quarter)")
    # Not a fuzzer that only ever gets refused at the door: both outcomes happen (among the
    # first MIN_EXAMPLES already, which every machine runs).
    assert ran >= MIN_EXAMPLES, ran
    assert b.outcomes["result"] > 0 and b.outcomes["refused"] > 0, b.outcomes


def test_the_longer_run_counts_what_came_out(tmp_path: Path) -> None:
    """``benchmarks/bench_fuzz_readers.py`` in a reduced mode: its table and its JSON."""
    out = tmp_path / "fuzz.json"
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fuzz_readers.py"
    proc = subprocess.run([sys.executable, str(bench), "--examples", "4", "--readers",
                           "snapshot", "record", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["inputs"] == 8 and doc["crashes_hangs_last_resorts"] == 0
    assert [r["reader"] for r in doc["readers"]] == ["snapshot", "record"]
    assert sum(doc["readers"][1]["outcomes"].values()) == 4 and doc["commands_run"] == 8
    assert "crashes, hangs and last resorts: 0" in proc.stdout
