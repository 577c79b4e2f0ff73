"""The options: one declaration (WatchConfig), typed keyword arguments (WatchOptions) that cannot
drift from it, misspelled names named with the closest valid one, every value validated at
construction; and the threading contract of ``step()``."""

from __future__ import annotations

import ast
import dataclasses
import re
import threading
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch import ConfigError, WatchConfig, WatchdogConfig
from memwatch.session.config import flags, spec
from memwatch.session.options import AdapterOptions, WatchOptions

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_watch_options_declare_exactly_the_config_fields() -> None:
    """The keyword types repeat the declaration (a type checker needs them written out): the
    same names, the same types, and the adapters' those their declarations pass on."""
    fields = typing.get_type_hints(WatchConfig)
    assert typing.get_type_hints(WatchOptions) == fields
    passed_on = {f.name for f in dataclasses.fields(WatchConfig) if spec(f).adapter}
    assert passed_on == set(fields) - {"log_every_n_steps", "warn"}
    assert typing.get_type_hints(AdapterOptions) == {n: fields[n] for n in passed_on}


def _option_rows(doc: str) -> dict[str, str]:
    """``docs/configuration.md``'s rows of the MemWatch option tables: name -> default."""
    section = doc.split("## `MemWatch(...)`", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    table = False
    for line in section.splitlines():
        if line.startswith("| option |"):
            table = True
        elif not line.startswith("|"):
            table = False
        elif table and (m := re.match(r"\| `(\w+)` \| ([^|]*) \|", line)):
            rows[m.group(1)] = m.group(2).strip()
    return rows


def _doc_default(text: str) -> Any:
    """A default as the docs write it: a Python literal, ``1 GiB``, ``259200.0 (3 days)``."""
    text = re.sub(r" \(.*\)$", "", text.strip()).strip("`")
    if m := re.fullmatch(r"(\d+) (GiB|MiB)", text):
        return int(m.group(1)) << (30 if m.group(2) == "GiB" else 20)
    return ast.literal_eval(text)


def test_the_docs_table_lists_every_option_with_its_default() -> None:
    rows = _option_rows((DOCS / "configuration.md").read_text())
    fields = {f.name: f.default for f in dataclasses.fields(WatchConfig)}
    assert set(rows) == set(fields)
    assert {n: _doc_default(d) for n, d in rows.items()} == fields


def test_the_docs_check_catches_a_missing_row_and_a_wrong_default() -> None:
    table = ("## `MemWatch(...)`\n\n| option | default | meaning |\n|---|---|---|\n"
             "| `capacity` | `16384` | rows |\n| `horizon_s` | `259200.0` (3 days) | s |\n\n"
             "## Next\n| option | default | meaning |\n| `memwatch` | `None` | x |\n")
    rows = _option_rows(table)
    assert rows == {"capacity": "`16384`", "horizon_s": "`259200.0` (3 days)"}
    assert _doc_default(rows["capacity"]) != WatchConfig.capacity
    assert set(rows) != {f.name for f in dataclasses.fields(WatchConfig)}


def test_every_flag_of_memwatch_run_is_documented() -> None:
    text = (DOCS / "run.md").read_text()
    missing = [fl.name for fl, _ in flags() if f"`{fl.name}" not in text]
    assert missing == []


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
