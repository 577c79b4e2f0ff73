"""The options: one declaration (WatchConfig), typed keyword arguments (WatchOptions) that cannot
drift from it, misspelled names named with the closest valid one, every value validated at
construction; and the threading contract of ``step()``."""

from __future__ import annotations

import dataclasses
import threading
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch import ConfigError, WatchConfig, WatchdogConfig
from memwatch.session.options import AdapterOptions, WatchOptions


def test_watch_options_declare_exactly_the_config_fields() -> None:
    fields = {f.name for f in dataclasses.fields(WatchConfig)}
    assert set(typing.get_type_hints(WatchOptions)) == fields
    assert set(typing.get_type_hints(AdapterOptions)) == fields - {"log_every_n_steps", "warn"}


@pytest.mark.parametrize("name,closest", [
    ("chek_every_n_steps", "check_every_n_steps"),
    ("tracemaloc", "tracemalloc"),
    ("out_directory", "out_dir"),
])
def test_a_misspelled_option_names_the_closest(name: str, closest: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown option '{name}'; did you mean '{closest}'"):
        memwatch.MemWatch(**{name: 1})  # type: ignore[misc]


def test_an_unknown_option_without_a_close_name_still_says_where_they_are() -> None:
    with pytest.raises(ConfigError, match="unknown option 'zzz'; the options are documented"):
        memwatch.MemWatch(zzz=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("option,value,fragment", [
    ("recorder", "off", "recorder='off' must be True or False"),
    ("signals", "no", "signals='no' must be True or False"),
    ("workers", 1, "workers=1 must be True or False"),
    ("analyzer_config", "strict", "analyzer_config='strict' must be a memwatch.AnalyzerConfig"),
    ("capacity", 10**10, "capacity=10000000000 rows would take"),
    ("buckets_per_epoch", 10**6, "buckets_per_epoch=1000000 must be an even int from 4"),
    ("total_steps", 2.5, "total_steps=2.5 must be a positive number (an int)"),
    ("stage", "training", "stage='training': use one of"),
    ("distributed", True, "distributed=True: use one of"),
    ("out_dir", "/proc/nope", "out_dir='/proc/nope' is under /proc"),
    ("watchdog", WatchdogConfig, "watchdog="),
])
def test_every_value_is_validated_at_construction(option: str, value: Any,
                                                   fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        memwatch.MemWatch(**{option: value})


def test_an_out_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "results.txt"
    f.write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        memwatch.MemWatch(out_dir=str(f))
    assert f.read_text() == "mine"


def test_watchdog_actions_of_the_wrong_type_are_named() -> None:
    with pytest.raises(ConfigError, match="watchdog on_warning=None: use an action or a tuple"):
        WatchdogConfig(on_warning=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("adapter", ["lightning", "transformers"])
def test_adapter_options_are_checked_the_same_way(adapter: str) -> None:
    mod = pytest.importorskip(f"memwatch.integrations.{adapter}")
    with pytest.raises(ConfigError, match="did you mean 'check_every_n_steps'"):
        mod.MemWatchCallback(chek_every_n_steps=500)
    with pytest.raises(ConfigError, match="did you mean 'watch_eval'"):
        mod.MemWatchCallback(wach_eval=False)
    with pytest.raises(ConfigError, match="recorder='off' must be True or False"):
        mod.MemWatchCallback(recorder="off")


def test_session_attributes_have_one_writer(tmp_path: Path) -> None:
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path))
    with pytest.raises(AttributeError, match="MemWatch.step_count is read-only"):
        mw.step_count = 95  # type: ignore[misc]
    mw.plan_run(total_steps=1000, steps_per_epoch=100)
    mw.plan_run(total_steps=5)  # the first planned length is kept
    assert (mw.total_steps, mw.steps_per_epoch) == (1000, 100)


def test_step_from_a_second_thread_is_ignored_with_one_warning(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path)) as mw:
        for _ in range(5):
            mw.step()
        caught: list[warnings.WarningMessage] = []

        def other() -> None:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for _ in range(3):
                    mw.step()
            caught.extend(w)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        for _ in range(5):
            mw.step()
        assert mw.step_count == 10 and not mw.disabled
        assert len(caught) == 1 and issubclass(caught[0].category, memwatch.MemWatchWarning)
        assert "thread other than the one" in str(caught[0].message)


def test_hand_over_moves_the_session_to_the_calling_thread(tmp_path: Path) -> None:
    """A driver that sampled from a timer thread hands the session to the training thread."""
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path)) as mw:
        timer = threading.Thread(target=lambda: [mw.step() for _ in range(4)])
        timer.start()
        timer.join()  # the timer thread took the session first
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning: the calls count once handed over
            mw.hand_over()
            for _ in range(6):
                mw.step()
        assert mw.step_count == 10 and not mw.disabled
