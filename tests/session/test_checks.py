"""Checks inside epochs: verdicts every N steps (or T seconds), with ``mw.step()`` alone.

Scripted device series (:class:`memwatch.testing.FakeDevice`) for the rules, and one real CPU
training loop of one long epoch that never calls ``end_epoch()``.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import memwatch
from memwatch import MemWatchWarning
from memwatch.sinks import MemorySink
from memwatch.testing import FakeDevice, malloc_trim

MIB = 1 << 20
GIB = 1 << 30
rng = np.random.default_rng(0)


def run_steps(tmp: Path, series: Callable[[int], float], steps: int, *,
              epoch_every: int | None = None, total: int = 64 * GIB,
              **options: Any) -> tuple[memwatch.MemWatch, list[Any]]:
    """Drive a session over a scripted device series; an epoch ends every ``epoch_every``
    steps (never, with None). Returns the session and the warnings it emitted."""
    dev = FakeDevice(total_bytes=total)
    options = {"host": False, "workers": False, "out_dir": tmp, "signals": False,
               "check_every_s": None, **options}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memwatch.watch(device=dev, **options) as mw:
            for s in range(steps):
                dev.set(allocated=int(series(s)))
                mw.step()
                if epoch_every and (s + 1) % epoch_every == 0:
                    mw.end_epoch()
    return mw, [w for w in caught if issubclass(w.category, MemWatchWarning)]


def leaks(mw: memwatch.MemWatch) -> list[Any]:
    return [f for f in mw.findings if f.kind == "leak"]


def test_a_leak_in_one_long_epoch_is_found_at_the_second_check(tmp_path: Path) -> None:
    mw, caught = run_steps(tmp_path, lambda s: GIB + s * 200_000 + rng.normal(0, 1e6), 2000,
                           check_every_n_steps=400, total=2 * GIB)
    found = leaks(mw)
    assert found and found[0].check == 1 and found[0].step == 800  # the second check
    assert found[0].epoch == 0 and mw.epochs == []  # no epoch ever ended
    assert found[0].severity in ("warning", "critical")
    assert "across 2 checks" in found[0].message
    # step() cannot return them: they are warned about (once per kind and metric).
    assert len(caught) == 1 and "leak in device.allocated" in str(caught[0].message)


def test_checks_every_n_steps_and_their_reports(tmp_path: Path) -> None:
    sink = MemorySink()
    mw, _ = run_steps(tmp_path, lambda s: GIB, 1000, check_every_n_steps=250, sinks=[sink])
    assert mw.checks == 4 and mw.findings == []
    assert [e for e, _, _ in sink.epochs] == [0, 0, 0, 0]  # training checks reach on_findings
    assert [s.n_steps for _, _, s in sink.epochs] == [250] * 4  # each judged its segment


def test_a_clean_long_epoch_stays_quiet(tmp_path: Path) -> None:
    mw, caught = run_steps(tmp_path, lambda s: GIB + rng.normal(0, 2e6), 3000,
                           check_every_n_steps=300)
    assert mw.checks == 10 and not [f for f in mw.findings if f.severity != "info"]
    assert caught == []


def test_warm_up_that_levels_off_is_not_a_leak(tmp_path: Path) -> None:
    mw, _ = run_steps(tmp_path, lambda s: GIB + 300e6 * (1 - np.exp(-s / 300))
                      + rng.normal(0, 2e5), 3000, check_every_n_steps=300)
    assert leaks(mw) == []


def test_epoch_scoped_accumulation_stays_apart_inside_later_epochs(tmp_path: Path) -> None:
    # Memory gathered during each 1,000-step epoch and released at its end, with checks every
    # 250 steps: inside epoch 1 and later, the epoch so far is judged against the closed
    # epochs, whose floors say the memory is released.
    mw, _ = run_steps(tmp_path, lambda s: GIB + (s % 1000) * 100_000 + rng.normal(0, 2e5),
                      4000, epoch_every=1000, check_every_n_steps=250, steps_per_epoch=1000)
    assert leaks(mw) == []
    assert "accumulation" in {f.kind for f in mw.findings}


def test_a_leak_in_a_later_epoch_is_found_inside_it(tmp_path: Path) -> None:
    # Clean for two epochs of 1,000 steps, then a leak from step 2,000: found inside epoch 2,
    # at a check, before that epoch ends.
    mw, _ = run_steps(tmp_path, lambda s: GIB + max(s - 2000, 0) * 200_000
                      + rng.normal(0, 2e5), 2900, epoch_every=1000, check_every_n_steps=250,
                      steps_per_epoch=1000)
    found = leaks(mw)
    assert found and found[0].epoch == 2 and found[0].step < 3000


def test_the_first_epoch_of_a_multi_epoch_run_waits_for_its_end(tmp_path: Path) -> None:
    # The run is planned with epochs of 1,000 steps: growth inside epoch 0 may be released at its
    # end, so the checks inside it say nothing about leaks; its end tells (here: released).
    mw, _ = run_steps(tmp_path, lambda s: GIB + (s % 1000) * 100_000 + rng.normal(0, 2e5),
                      1000, check_every_n_steps=200, steps_per_epoch=1000)
    assert mw.checks == 5 and leaks(mw) == []


def test_checks_by_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rows' clock, injected: 40 steps take no time at all here, however loaded the machine
    # (40 real steps once took longer than a 50-ms period on one, and checked early).
    from memwatch.session.sampling import Sampling

    now = [1000.0]
    monkeypatch.setattr(Sampling, "clock", staticmethod(lambda: now[0]))
    dev = FakeDevice(total_bytes=GIB)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path,
                        check_every_n_steps=None, check_every_s=0.05) as mw:
        for _ in range(40):
            mw.step()
        now[0] += 0.049
        mw.step()
        assert mw.checks == 0
        now[0] += 0.002
        mw.step()  # the first step after the period runs the check
        assert mw.checks == 1
        for _ in range(40):
            mw.step()
        assert mw.checks == 1  # the next period counts from that check
        now[0] += 0.05
        mw.step()
        assert mw.checks == 2


def test_no_checks_inside_epochs_when_turned_off(tmp_path: Path) -> None:
    # No check while it runs; the last word at close judges the one segment it saw (one segment
    # never makes a leak: there is no earlier check to confirm it against).
    mw, _ = run_steps(tmp_path, lambda s: GIB + s * 200_000, 2000, check_every_n_steps=None)
    assert mw.checks == 1 and mw.findings == []


@pytest.mark.parametrize("option,value,fragment", [
    ("check_every_n_steps", 5, "check_every_n_steps=5 must be an int >= 16"),
    ("check_every_n_steps", 2.5, "check_every_n_steps=2.5"),
    ("check_every_s", 0, "check_every_s=0 must be a positive number"),
    ("horizon_s", -1, "horizon_s=-1 must be a positive number"),
    ("steps_per_epoch", 0, "steps_per_epoch=0 must be a positive number"),
])
def test_bad_check_options(option: str, value: Any, fragment: str) -> None:
    with pytest.raises(memwatch.ConfigError, match=fragment.replace("(", r"\(")):
        memwatch.MemWatch(**{option: value})


# ---------------------------------------------------------------------- severity by consequence
def test_growth_that_cannot_kill_the_run_is_information_in_words(tmp_path: Path) -> None:
    # 10 kB per step against 64 GiB, in a run of 3,000 planned steps: years away at this pace.
    mw, caught = run_steps(tmp_path, lambda s: GIB + s * 10_000, 3000, epoch_every=1000,
                           check_every_n_steps=None, total_steps=3000)
    (f, *_) = leaks(mw)
    assert f.severity == "info" and caught == []
    assert "after this run ends" in f.message and "not a threat to this run" in f.message


def test_the_same_growth_in_a_long_run_is_a_warning(tmp_path: Path) -> None:
    mw, caught = run_steps(tmp_path, lambda s: GIB + s * 10_000, 3000, epoch_every=1000,
                           check_every_n_steps=None, total_steps=100_000_000)
    (f, *_) = leaks(mw)
    assert f.severity == "warning" and "is reached in about" in f.message


def test_imminent_growth_is_critical(tmp_path: Path) -> None:
    # 1 MiB per step with 600 MiB left: the limit comes within two epochs.
    mw, _ = run_steps(tmp_path, lambda s: 6 * GIB + s * MIB, 900, epoch_every=300,
                      check_every_n_steps=None, total=int(7 * GIB))
    assert leaks(mw)[0].severity == "critical"


def test_without_a_run_length_the_horizon_is_wall_time(tmp_path: Path) -> None:
    # Unknown length: growth reaching the limit within horizon_s of wall time is a warning.
    slow, _ = run_steps(tmp_path, lambda s: GIB + s * 10_000, 3000, epoch_every=1000,
                        check_every_n_steps=None, horizon_s=1e-3)
    assert leaks(slow)[0].severity == "info"


# ---------------------------------------------------------------------- a real loop
kept_outputs: list[torch.Tensor] = []


@pytest.mark.fresh_process  # a planted host leak judged as in a fresh training process
@pytest.mark.parametrize("leaking", [True, False], ids=["leak", "clean"])
def test_plain_loop_one_long_epoch_step_alone(tmp_path: Path, leaking: bool) -> None:
    """A real loop that only ever calls ``mw.step()``: findings come anyway, in ``mw.findings``,
    in the sinks and as warnings."""
    kept_outputs.clear()
    # Earlier tests in this process leave freed heap behind; the leak would first refill it
    # without RSS moving (a stair-like series). Hand it back so the run starts as a fresh
    # process would.
    gc.collect()
    malloc_trim()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, sinks=[sink],
                            check_every_n_steps=200, check_every_s=None,
                            total_steps=10_000_000) as mw:
            for _ in range(800):
                x = torch.randn(16, 32)
                out = model(x)
                loss = out.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if leaking:
                    kept_outputs.append(torch.ones(16384))  # the planted leak: 64 KiB a step
                mw.step()
    said = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]
    found = [f for f in mw.findings if f.kind == "leak" and f.metric == "host.rss"]
    if leaking:
        assert found and found[0].check is not None and found[0].check <= 2, mw.findings
        assert "kept_outputs" in (found[0].culprit or "")
        assert any("kept_outputs" in t for t in said)
        assert found[0] in sink.findings  # the same object reached the sinks
    else:
        assert not found and not said, [f.to_dict() for f in mw.findings]
    kept_outputs.clear()


def test_memwatch_own_objects_are_not_counted_by_the_census() -> None:
    from memwatch.analysis.culprits.census.census import take_census
    from memwatch.core.findings import Finding

    kept = [Finding(kind="leak", severity="info", metric="m", message=str(i)) for i in range(500)]
    types = take_census().types
    assert "Finding" not in types and "dict" in types
    del kept


def test_sensitivity_names_the_smallest_leak_the_run_confirms(tmp_path: Path) -> None:
    """``mw.sensitivity()`` is a claim about detection: a leak well above it is confirmed, one
    well below it is not (same noise, same check interval)."""
    noise = np.random.default_rng(7)
    flat, _ = run_steps(tmp_path / "flat", lambda s: GIB + noise.normal(0, 1e6), 1200,
                        check_every_n_steps=400, total=4 * GIB)
    floor = flat.sensitivity()["device.allocated"]
    assert 0 < floor < 1e6  # a per-step figure, far below one step's noise
    assert not leaks(flat)
    above, _ = run_steps(tmp_path / "above", lambda s: GIB + 3 * floor * s + noise.normal(0, 1e6),
                         1200, check_every_n_steps=400, total=4 * GIB)
    below, _ = run_steps(tmp_path / "below", lambda s: GIB + floor / 4 * s + noise.normal(0, 1e6),
                         1200, check_every_n_steps=400, total=4 * GIB)
    assert leaks(above) and not leaks(below)


def test_sensitivity_is_empty_before_the_first_check(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=GIB)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path,
                        check_every_n_steps=400) as mw:
        for _ in range(10):
            mw.step()
        assert mw.sensitivity() == {}
    assert mw.sensitivity()  # the last word at close was a check
