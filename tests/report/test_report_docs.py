"""The docs hold together: every relative link (and #anchor) in docs/ and README.md resolves,
and docs/index.md links every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(index)}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md"
                     and p.name not in linked)
    assert not missing, f"docs/index.md does not link {missing}"
