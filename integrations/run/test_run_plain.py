"""``memwatch run`` on a plain PyTorch loop that knows nothing of memwatch
(``examples/run/train_plain.py``): watched through torch's optimizer step hook, its leak is found
and its holder named at a check; its clean twin is quiet; its output and exit code are the bare
run's; W&B gets memwatch's keys when the script logs to W&B; a death by host OOM leaves a bundle.
"""

from __future__ import annotations

import resource

from run_helpers import (
    FAST,
    PY,
    Spec,
    assert_leak_found,
    assert_quiet,
    check_number,
    run_together,
    script,
)

from memwatch.bundle import open_bundle

TRAIN = script("train_plain.py")
STEPS = ("--steps", "128")


def test_leak_found_with_its_holder_clean_twin_quiet_output_unchanged(tmp_path) -> None:
    runs = run_together(
        tmp_path,
        Spec("bare", [PY, TRAIN, *STEPS]),
        Spec("clean", [PY, TRAIN, *STEPS], (*FAST, "--out-dir", "out")),
        Spec("leak", [PY, TRAIN, *STEPS, "--leak", "--wandb"], (*FAST, "--out-dir", "out")),
    )
    bare, clean, leak = runs["bare"], runs["clean"], runs["leak"]
    # The script's own output and exit code are the bare run's (the leak changes no number).
    assert bare.rc == clean.rc == leak.rc == 0, leak.explain()
    assert clean.out == bare.out == leak.out and "trained 128 steps" in bare.out
    assert bare.err == ""
    line = assert_leak_found(leak, "kept (list")
    assert "train_plain" in line or "__main__" in line, line
    # The leak starts at the first step: confirmed and named by the last of the 4 checks (checks
    # count from 0). Named at the third (2) when the second check's series showed steady growth
    # and took the baseline census; when it showed only a stair (three runs at once on 2 cores)
    # the census it hints at is beyond the budget of a 128-step run, and the holder is named one
    # check later (docs/findings.md, "what memwatch cannot see").
    assert check_number(line) <= 3, line
    assert any("watched the plain loop" in ln and "128 step(s), 4 check(s)" in ln
               for ln in leak.memwatch_lines()), leak.explain()
    assert_quiet(clean)
    for r in (clean, leak):
        assert (r.cwd / "out" / "report.html").is_file()
        assert f"report: {r.cwd / 'out' / 'report.html'}" in r.err
    # The script's W&B run holds memwatch's samples and its verdict, read back offline.
    from memwatch.testing.wandb_offline import read_offline_run

    (run_dir,) = (leak.cwd / "wandb").glob("offline-run-*")
    data = read_offline_run(run_dir)
    assert any("memwatch/host.rss_gib" in row for row in data.history), data.history[-1:]
    # On the script's own rows (memwatch adds none), one findings table in the summary.
    assert all("loss" in row for row in data.history), data.history[-1:]
    assert data.summary_table("memwatch/findings_table"), sorted(data.summary)


def _address_space_3gib() -> None:
    # Set in the child before it starts (as `ulimit -v` would): the runaway cache of --hog
    # (128 MiB of address space a step) exhausts it after a dozen steps.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))


def test_a_death_by_host_oom_leaves_its_bundle_and_the_same_exit_code(tmp_path) -> None:
    cmd = [PY, TRAIN, "--steps", "400", "--hog", "128"]
    runs = run_together(
        tmp_path,
        Spec("bare", cmd, preexec=_address_space_3gib),
        Spec("watched", cmd, ("--no-workers", "--report", "tables", "--out-dir", "out"),
             preexec=_address_space_3gib),
    )
    bare, watched = runs["bare"], runs["watched"]
    assert bare.rc == watched.rc == 1, watched.explain()
    for r in (bare, watched):
        assert "can't allocate memory" in r.err and r.out.startswith("step 0: loss"), r.explain()
    assert "trained" not in watched.out
    (bundle,) = (watched.cwd / "out" / "oom").iterdir()
    manifest = open_bundle(bundle).manifest
    assert manifest["classification"] == "host_oom" and manifest["trigger"] == "exception"
    assert any(f"bundle of the failure: {bundle}" in ln for ln in watched.memwatch_lines()), \
        watched.explain()
    # The original traceback is printed as without memwatch (the bundle is named in its notes).
    tb = watched.err[watched.err.index("Traceback"):]
    assert "RuntimeError: [enforce fail" in tb and "kept.append(torch.empty" in tb
