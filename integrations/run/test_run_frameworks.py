"""``memwatch run`` on Lightning, transformers and Accelerate scripts that know nothing of
memwatch (``examples/run/``): the matching adapter is attached by itself (and nothing twice:
the framework's optimizer steps are not counted again by the plain-loop hook), the planted leak
is found with its holder, the clean twin is quiet, and the scripts' output and exit code are
their own.

Each test starts its runs together: the leak, its clean twin (and where it is cheap a bare run
to compare the output with).
"""

from __future__ import annotations

from run_helpers import (
    FAST,
    PY,
    Spec,
    assert_leak_found,
    assert_quiet,
    run_together,
    script,
)

SIZE = ("--epochs", "3", "--batches", "32")  # 96 optimizer steps


def _summary(run, what: str) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in run.memwatch_lines() if ln.startswith("memwatch: watched ")]
    assert len(lines) == 1 and what in lines[0], run.explain()
    return lines[0]


def test_lightning_trainer_gets_the_callback(tmp_path) -> None:
    train = script("train_lightning.py")
    runs = run_together(tmp_path, Spec("clean", [PY, train, *SIZE], FAST),
                        Spec("leak", [PY, train, *SIZE, "--leak"], FAST))
    clean, leak = runs["clean"], runs["leak"]
    expected = "".join(f"epoch {e} done at step {32 * (e + 1)}\n" for e in range(3)) + \
        "trained 96 steps\n"
    assert clean.out == leak.out == expected  # the script's own output, nothing else
    assert_leak_found(leak, "Regressor.kept (list")
    # One line per verdict: memwatch run's, no notice of the adapter's own beside it.
    assert not [ln for ln in leak.err.splitlines() if ln.startswith("memwatch: leak in ")], \
        leak.explain()
    assert_quiet(clean)
    for r in (clean, leak):
        # One sample per optimizer step: 96, not 192 (the plain-loop hook stays out of it).
        assert "96 step(s)" in _summary(r, "the Lightning Trainer"), r.explain()
        # The adapter's own default folder: <default_root_dir>/memwatch.
        assert (r.cwd / "memwatch" / "report.html").is_file()


def test_transformers_trainer_gets_the_callback(tmp_path) -> None:
    train = script("train_transformers.py")
    runs = run_together(tmp_path, Spec("clean", [PY, train, *SIZE], FAST),
                        Spec("leak", [PY, train, *SIZE, "--leak"], FAST))
    clean, leak = runs["clean"], runs["leak"]
    assert_leak_found(leak, "Regressor.kept (list")
    assert_quiet(clean)
    for r in (clean, leak):
        assert "96 step(s)" in _summary(r, "the transformers Trainer"), r.explain()
        assert r.out.rstrip().endswith("trained 96 steps")
        # The trainer's own rows are all still printed (memwatch's keys ride along on them).
        assert r.out.count("'loss': ") == 3, r.out
        assert (r.cwd / "memwatch-run-hf" / "memwatch" / "report.html").is_file()


def test_accelerate_loop_gets_the_hook(tmp_path) -> None:
    train = script("train_accelerate.py")
    runs = run_together(tmp_path, Spec("bare", [PY, train, *SIZE]),
                        Spec("clean", [PY, train, *SIZE], (*FAST, "--out-dir", "out")),
                        Spec("leak", [PY, train, *SIZE, "--leak"], (*FAST, "--out-dir", "out")))
    bare, clean, leak = runs["bare"], runs["clean"], runs["leak"]
    assert bare.rc == 0 and clean.out == leak.out == bare.out, bare.explain()
    assert_leak_found(leak, "kept (list")
    assert_quiet(clean)
    for r in (clean, leak):
        # The hook is attached at the first step and samples from the next one.
        assert "95 step(s)" in _summary(r, "the Accelerate loop"), r.explain()
        assert (r.cwd / "out" / "report.html").is_file()
