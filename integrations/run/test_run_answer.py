"""Every run gets its answer: ``memwatch run`` on a plain loop of unknown length at the defaults
(checks sized to the run, the last word at exit), and what it leaves in its out_dir read back by
``memwatch ls``, ``inspect`` and ``report``; in words that fit a loop without epochs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from run_helpers import PY, Spec, run_together

from memwatch.bundle.run_summary import read_summary
from memwatch.cli import main as cli

LOOP = str(Path(__file__).with_name("dict_cache_loop.py"))


def _visible(html: str) -> str:
    """The report without plotly.js (a library, whose code has its own words)."""
    return re.sub(r"<script>.*?</script>",
                  lambda m: "" if len(m.group(0)) > 100_000 else m.group(0), html, flags=re.S)


def test_a_short_plain_loop_at_the_defaults_gets_its_verdict_by_exit(tmp_path, capsys) -> None:
    runs = run_together(tmp_path, Spec("leak", [PY, LOOP], ()),
                        Spec("clean", [PY, LOOP, "--clean"], ()))
    leak, clean = runs["leak"], runs["clean"]
    assert leak.rc == clean.rc == 0 and "trained 1200 steps" in leak.out, leak.explain()
    lines = leak.memwatch_lines()
    # One console line per verdict, naming the dict, as a check made it (before the summary).
    said = [ln for ln in leak.verdicts() if "leak in host.rss" in ln]
    assert len(said) == 1 and "dict_cache_loop.cache (dict" in said[0], leak.explain()
    assert not any("epoch" in ln.lower() for ln in lines), lines
    out = leak.cwd / "memwatch"
    doc = read_summary(out)
    (v,) = [v for v in doc["verdicts"] if v["kind"] == "leak"]
    assert v["metric"] == "host.rss" and v["holder"] == "dict_cache_loop.cache", v
    assert v["severity"] in ("warning", "critical") and doc["steps"] == 1200
    assert doc["checks"] >= 2 and doc["exit"]["status"] == "completed"  # the last word, at least
    assert "epoch" not in json.dumps(doc)
    assert "epoch" not in _visible((out / "report.html").read_text()).lower()
    # The clean twin: quiet, and its report says so.
    assert not clean.verdicts() and read_summary(clean.cwd / "memwatch")["verdict"] == "ok"
    # The CLI finds the runs without bundles: ls says which is which, report opens it.
    capsys.readouterr()
    assert cli(["ls", str(out)]) == 0
    said_ls = capsys.readouterr().out
    assert "no bundles under" in said_ls and "finished runs, not bundles" in said_ls
    assert "1,200 steps" in said_ls and "leak in host.rss" in said_ls
    assert cli(["inspect", str(out)]) == 0
    assert "held by dict_cache_loop.cache" in capsys.readouterr().out
    dest = tmp_path / "r.html"
    assert cli(["report", str(clean.cwd / "memwatch"), "-o", str(dest)]) == 0
    assert dest.read_text() == (clean.cwd / "memwatch" / "report.html").read_text()

