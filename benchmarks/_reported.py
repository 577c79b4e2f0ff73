"""Scoring of the reported-bug corpus (issue 16): the ``rep_*`` reproductions of memory problems
users reported in public threads, and their fixed twins.

Per scenario, by its label (from the thread, never from memwatch):

* a **leak**: *found* (a leak verdict on the expected metric by the bench's deadline) and
  *holder named* (the scenario's expected culprit is a substring of a verdict's culprit);
* a **non-leak** (mapped file pages, copy-on-write, epoch-scoped accumulation): the *right
  kind* (a finding of the kind the thread concluded) and no leak verdict;
* a **fixed twin**: quiet (no leak verdict).
"""

from __future__ import annotations

from typing import Any

#: The scenario's ``expected_kind`` -> the (finding kind, evidence pattern or None) that says it.
KIND_FINDINGS: dict[str, tuple[str, str | None]] = {
    "mapped_file": ("mapped_file", None),
    "copy_on_write": ("plateau", "copy_on_write"),
    "accumulation": ("accumulation", None),
    "worker_count": ("leak", "worker_count"),
}


def kinds_said(raw: dict[str, Any]) -> list[list[str | None]]:
    """Every (kind, pattern) any check said, in the order first said."""
    seen: list[list[str | None]] = []
    fs = raw.get("all_findings") or [f for e in raw.get("findings", []) for f in e]
    for f in fs:
        k = [f.get("kind"), (f.get("evidence") or {}).get("pattern")]
        if k not in seen:
            seen.append(k)
    return seen


def score(sc: Any, row: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any] | None:
    """The reported-corpus verdict on one scenario (None when it is not part of that corpus)."""
    if not (getattr(sc, "reported", False) or getattr(sc, "twin_of", None)):
        return None
    mw = row.get("memwatch", {})
    out: dict[str, Any] = {"label": "leak" if sc.is_leak else sc.expected_kind,
                           "source": sc.source, "twin_of": sc.twin_of}
    if sc.twin_of is not None:
        out["ok"] = not mw.get("false_alarm", False)
        return out
    said = kinds_said(raw)
    if sc.is_leak:
        out["found"] = bool(mw.get("detected"))
        out["holder"] = bool(mw.get("culprit_ok"))
        want = KIND_FINDINGS.get(sc.expected_kind)
        out["kind"] = want is None or any(
            k == want[0] and (want[1] is None or p == want[1]) for k, p in said)
        return out
    want = KIND_FINDINGS.get(sc.expected_kind)
    out["kind"] = want is not None and not mw.get("false_alarm", False) and any(
        k == want[0] and (want[1] is None or p == want[1]) for k, p in said)
    out["said"] = said
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    rep = [r for r in rows if r.get("reported_score")]
    if not rep:
        return None
    leaks = [r["reported_score"] for r in rep if r["reported_score"]["label"] == "leak"
             and r["reported_score"]["twin_of"] is None]
    non = [r["reported_score"] for r in rep if r["reported_score"]["label"] != "leak"
           and r["reported_score"]["twin_of"] is None]
    twins = [r["reported_score"] for r in rep if r["reported_score"]["twin_of"] is not None]
    return {"leaks": len(leaks), "found": sum(s["found"] for s in leaks),
            "holder": sum(s["holder"] for s in leaks),
            "leak_kind": sum(s["kind"] for s in leaks),
            "non_leaks": len(non), "right_kind": sum(s["kind"] for s in non),
            "twins": len(twins), "twins_quiet": sum(s["ok"] for s in twins)}


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any] | None) -> None:
    if summary is None:
        return
    print()
    print("Reported-bug corpus (labels from the threads; benchmarks/scenarios/reported/README.md)")
    print(f"{'scenario':<28} {'label':<14} {'found':>6} {'holder':>7} {'kind':>5} {'twin':>6}")
    for r in rows:
        s = r.get("reported_score")
        if not s:
            continue

        def yn(v: Any) -> str:
            return "-" if v is None else ("yes" if v else "NO")

        twin = yn(s.get("ok")) if s["twin_of"] else "-"
        print(f"{r['name']:<28} {s['label']:<14} {yn(s.get('found')):>6} "
              f"{yn(s.get('holder')):>7} {yn(s.get('kind')):>5} {twin:>6}")
    m = summary
    print(f"leaks found {m['found']}/{m['leaks']}, holder named {m['holder']}/{m['leaks']}, "
          f"right kind {m['leak_kind']}/{m['leaks']}; non-leaks of the right kind "
          f"{m['right_kind']}/{m['non_leaks']}; fixed twins quiet {m['twins_quiet']}/{m['twins']}")
