"""Terminal views: ``memwatch inspect`` (rich and plain) and end-of-epoch summaries."""

from __future__ import annotations

import gc
import io
import os
from pathlib import Path

import pytest

import memwatch
import report_builders as rb
from memwatch.bundle import open_bundle
from memwatch.cli import main
from memwatch.report.summary import summarize
from memwatch.report.terminal import (
    epoch_summary_text,
    print_epoch_summary,
    print_summary,
    render_rich,
)
from memwatch.testing import malloc_trim


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rb.oom_bundle(tmp_path_factory.mktemp("terminal-bundle"), history=False)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rich_view_of_a_bundle(bundle: Path) -> None:
    text = render_rich(summarize(open_bundle(bundle)), color=False, width=120)
    for part in ("The GPU ran out of memory (CUDA OOM) while allocating 120.0 MiB",
                 "How full memory was", "device.allocated", "Largest live tensors",
                 "Findings (", "leak", "Timeline, last 12 of 150 samples",
                 "3 epoch summaries recorded"):
        assert part in text, part
    assert "\x1b[" not in text  # no colour codes when asked for none
    coloured = render_rich(summarize(open_bundle(bundle)), color=True, width=120)
    assert "\x1b[" in coloured


def test_inspect_formats(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(bundle), "--format", "rich", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "╭" in out and "Timeline, last 3 of 150 samples" in out
    assert "Allocator snapshot:" in out
    # Not a terminal (a pipe, a log file): plain text, same content.
    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "╭" not in out and "How full memory was" in out and "Allocator snapshot:" in out


def test_auto_picks_rich_on_a_terminal_unless_no_color(bundle: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s = summarize(open_bundle(bundle))
    tty = _Tty()
    print_summary(s, file=tty)
    assert "╭" in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    tty = _Tty()
    print_summary(s, file=tty)
    assert "╭" not in tty.getvalue() and "How full memory was" in tty.getvalue()


def test_epoch_summaries(tmp_path: Path) -> None:
    held: list[bytes] = []
    # Earlier tests' freed heap goes back to the kernel first: the 5 MiB below would otherwise
    # refill it and RSS would not rise (the floor fell by 3 MiB after the other tests of this
    # file, on main too).
    gc.collect()
    malloc_trim()
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        watchdog=False) as mw:
        for _ in range(20):
            mw.step()
        assert epoch_summary_text(mw, []) == "memwatch: no epoch closed yet\n"
        first = mw.end_epoch()
        for _ in range(20):
            held.append(os.urandom(1024 * 1024))  # 20 MiB held: the floor rises
            mw.step()
        new = mw.end_epoch()
    text = epoch_summary_text(mw, new)
    lines = text.splitlines()
    assert lines[0] == "memwatch: epoch 1 ended at step 40 (20 steps)"
    rss = next(ln for ln in lines if ln.strip().startswith("host.rss"))
    assert rss.split()[-2].startswith("+"), rss  # the floor rose against epoch 0
    plain = io.StringIO()
    print_epoch_summary(mw, first, file=plain)
    assert plain.getvalue() == epoch_summary_text(mw, first)
    tty = _Tty()
    print_epoch_summary(mw, new, file=tty, fmt="rich")
    assert "floor vs previous" in tty.getvalue() and "host.rss" in tty.getvalue()
