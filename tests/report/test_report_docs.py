"""The docs hold together: every relative link (and #anchor) in docs/ and README.md resolves,
docs/index.md links every page of docs/, and every example marked runnable runs as written."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", md.read_text(), re.M)}


def test_relative_links_resolve() -> None:
    broken = []
    for md in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in LINK.findall(md.read_text()):
            if re.match(r"^[a-z]+:", target):  # http(s):, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{md.relative_to(ROOT)} -> {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_named_repo_paths_exist() -> None:
    """A test, benchmark or example file named in the docs, the benchmarks' docstrings or the
    Makefile exists (files move when the tree is reshaped; a stale path sends a reader nowhere)."""
    named = re.compile(r"(?<![\w/.-])((?:tests|benchmarks|examples)/[\w/]+\.py)")
    sources = [ROOT / "README.md", ROOT / "Makefile", *sorted(DOCS.glob("*.md")),
               *sorted((ROOT / "benchmarks").rglob("*.py")),
               *sorted((ROOT / "benchmarks").rglob("*.md"))]
    missing = sorted({f"{src.relative_to(ROOT)}: {m}" for src in sources
                      for m in named.findall(src.read_text()) if not (ROOT / m).exists()})
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(index)}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md"
                     and p.name not in linked)
    assert not missing, f"docs/index.md does not link {missing}"


# ---------------------------------------------------------------- examples marked runnable
# A fenced ```python or ```console block right after an HTML comment `<!-- runnable -->` (which
# renders as nothing) runs here: the blocks of one page in order, in one scratch folder, with this
# interpreter and its `memwatch` on PATH (as in an activated environment). A python block must
# exit 0, or what `<!-- runnable: exit=N -->` says (an example that shows a crash); in a console
# block every `$ ` line is a shell command that must exit 0 (the other lines are its output, as
# printed when the page was written, not compared: timestamps and paths differ).
MARKED = re.compile(r"^<!-- runnable(?::\s*exit=(?P<exit>\d+))?\s*-->\n```(?P<lang>\w+)[^\n]*\n"
                    r"(?P<body>.*?)^```", re.M | re.S)
MARKER = re.compile(r"^<!-- runnable\b.*$", re.M)


@dataclasses.dataclass
class Example:
    where: str  # "docs/page.md:12"
    lang: str
    body: str
    exit: int


def runnable(md: Path) -> list[Example]:
    text = md.read_text()
    found = []
    for m in MARKED.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        found.append(Example(f"{md.relative_to(ROOT) if md.is_relative_to(ROOT) else md}:{line}",
                             m.group("lang"), m.group("body"), int(m.group("exit") or 0)))
    # A marker that is not right above a python/console fence is a mistake, not a skip.
    assert len(MARKER.findall(text)) == len(found), f"{md}: a runnable marker is not above a fence"
    assert all(e.lang in ("python", "console") for e in found), f"{md}: runnable python/console"
    return found


def run_examples(examples: list[Example], cwd: Path, timeout: float = 180) -> list[str]:
    """Run ``examples`` in order in ``cwd``; one line per failure (none: all ran as written)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", MPLBACKEND="Agg", WANDB_MODE="offline",
               HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    failures = []
    for i, ex in enumerate(examples):
        if ex.lang == "python":
            script = cwd / f"example_{i}.py"
            script.write_text(ex.body)
            cmds = [([sys.executable, str(script)], ex.exit, "python")]
        else:
            cmds = [(["bash", "-c", ln[2:]], 0, ln[2:]) for ln in ex.body.splitlines()
                    if ln.startswith("$ ")]
        for argv, want, what in cmds:
            try:
                r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                   timeout=timeout)
            except subprocess.TimeoutExpired:
                failures.append(f"{ex.where}: {what}: still running after {timeout:.0f} s")
                continue
            if r.returncode != want:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                failures.append(f"{ex.where}: {what}: exit {r.returncode}, expected {want}: "
                                + " | ".join(tail))
    return failures


PAGES = [p for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))] if MARKER.search(
    p.read_text())]


def test_runnable_examples_are_marked() -> None:
    # The check runs something: the pages whose examples run quickly and offline are marked.
    assert {p.name for p in PAGES} >= {"plain-loop.md", "flight-recorder.md"}
    assert sum(len(runnable(p)) for p in PAGES) >= 3


@pytest.mark.slow  # one interpreter (torch) per python example
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_runnable_examples_run(page: Path, tmp_path: Path) -> None:
    failures = run_examples(runnable(page), tmp_path)
    assert not failures, "examples that do not run as written:\n" + "\n".join(failures)


def test_the_check_fails_when_a_marked_example_breaks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        <!-- runnable -->
        ```python
        print(undefined_name)
        ```

        ```python
        raise SystemExit(3)   # not marked: never run
        ```

        <!-- runnable: exit=1 -->
        ```python
        print("expected to fail, but exits 0")
        ```

        <!-- runnable -->
        ```console
        $ echo fine
        fine
        $ memwatch ls no-such-dir
        ```

        <!-- runnable -->
        ```python
        import sys; sys.exit(0)
        ```
        """))
    examples = runnable(page)
    assert [e.lang for e in examples] == ["python", "python", "console", "python"]
    failures = run_examples(examples, tmp_path, timeout=60)
    assert len(failures) == 3, failures
    assert "page.md:2: python: exit 1, expected 0" in failures[0]
    assert "NameError: name 'undefined_name' is not defined" in failures[0]
    assert "page.md:11: python: exit 0, expected 1" in failures[1]
    assert "page.md:16: memwatch ls no-such-dir: exit 2, expected 0" in failures[2]
    stray = tmp_path / "stray.md"
    stray.write_text("<!-- runnable -->\nsome text\n")
    with pytest.raises(AssertionError, match="not above a fence"):
        runnable(stray)
