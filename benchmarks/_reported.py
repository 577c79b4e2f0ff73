"""Scoring of the reported-bug corpus (issues 16 and 23): the reproductions of memory problems
users reported in public threads, and their fixed twins, scored per part of the corpus
(``Scenario.split``: ``design``, what the rules are designed on; ``heldout``, scored only here).

Per scenario, by its label (from the thread, never from memwatch):

* a **leak**: *found* (a leak verdict on the expected metric by the bench's deadline, the end of
  the second epoch after the leak starts, i.e. the third check), *found by the 2nd check* (by the
  end of the epoch after the one it starts in: the second check that sees it), *holder named*
  (the thread's holder, ``expected_culprit``, is a substring of a verdict's culprit; a leak whose
  holder the main process cannot see has none and is not counted) and the *right kind*;
* a **non-leak** (mapped file pages, copy-on-write, accumulation, a bounded cache or buffer, a
  constant per-epoch cost): the *right kind* (the finding the thread's conclusion calls for) and
  no leak verdict;
* a **fixed twin**: quiet (no leak verdict).

Beside these per-check scores, **at the end**: what the run believes after its last check (the
current belief of every suspected leak, ``bench_detection.end_state``): a leak still believed for
a leak, none for a non-leak or a twin.
"""

from __future__ import annotations

from typing import Any

#: The scenario's ``expected_kind`` -> the (finding kind, evidence pattern or None) that say it;
#: any one of them is the right kind. ``none`` (a constant cost, nothing to say) is right when
#: there is no leak verdict.
KIND_FINDINGS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "mapped_file": (("mapped_file", None),),
    "copy_on_write": (("plateau", "copy_on_write"),),
    "accumulation": (("accumulation", None),),
    "worker_count": (("leak", "worker_count"),),
    # Grows to a bound (a cache's size, a buffer's capacity, one validation's outputs), then
    # stays: a plateau, or a step when it fills at once.
    "bounded": (("plateau", None), ("step_change", None)),
    "none": (),
}

SPLITS = ("design", "heldout")


def kinds_said(raw: dict[str, Any]) -> list[list[str | None]]:
    """Every (kind, pattern) any check said, in the order first said."""
    seen: list[list[str | None]] = []
    fs = raw.get("all_findings") or [f for e in raw.get("findings", []) for f in e]
    for f in fs:
        k = [f.get("kind"), (f.get("evidence") or {}).get("pattern")]
        if k not in seen:
            seen.append(k)
    return seen


def _said_kind(expected_kind: str, said: list[list[str | None]]) -> bool:
    want = KIND_FINDINGS.get(expected_kind)
    if want is None:  # "leak": any leak verdict is of the right kind
        return True
    return any(k == wk and (wp is None or p == wp) for k, p in said for wk, wp in want)


def score(sc: Any, row: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any] | None:
    """The reported-corpus verdict on one scenario (None when it is not part of that corpus)."""
    if not (getattr(sc, "reported", False) or getattr(sc, "twin_of", None)):
        return None
    mw = row.get("memwatch", {})
    out: dict[str, Any] = {"label": "leak" if sc.is_leak else sc.expected_kind,
                           "source": sc.source, "twin_of": sc.twin_of,
                           "split": getattr(sc, "split", "design")}
    out["end"] = bool((mw.get("end") or {}).get("ok"))
    if sc.twin_of is not None:
        out["ok"] = not mw.get("false_alarm", False)
        return out
    said = kinds_said(raw)
    out["said"] = said
    if sc.is_leak:
        out["found"] = bool(mw.get("detected"))
        out["found_2nd"] = bool(mw.get("next_epoch"))
        out["holder"] = None if sc.expected_culprit is None else bool(mw.get("culprit_ok"))
        out["kind"] = _said_kind(sc.expected_kind, said)
        return out
    quiet = not mw.get("false_alarm", False)
    out["kind"] = quiet and (sc.expected_kind == "none" or (
        sc.expected_kind in KIND_FINDINGS and _said_kind(sc.expected_kind, said)))
    out["quiet"] = quiet
    if not out["kind"]:
        # What the run's series did, kept so that a kind missed once (a loaded CI machine) can
        # be placed afterwards without running it again.
        out["kind_evidence"] = epoch_shape(raw, sc.expected_metric + ".")
    return out


def epoch_shape(raw: dict[str, Any], prefix: str) -> dict[str, list[list[float]]]:
    """Per series of ``prefix`` (``host.``), each epoch's first, lowest and last sample, MiB."""
    out: dict[str, list[list[float]]] = {}
    steps = raw.get("steps") or []
    for key, vals in (raw.get("series") or {}).items():
        if not key.startswith(prefix):
            continue
        epochs = []
        for meta in raw.get("epoch_meta") or []:
            lo, hi = meta.get("start_step", 0), meta.get("end_step", 0)
            xs = [v for st, v in zip(steps, vals, strict=False)
                  if lo <= st <= hi and isinstance(v, int | float)]
            if xs:
                epochs.append([round(xs[0] / 2**20, 1), round(min(xs) / 2**20, 1),
                               round(xs[-1] / 2**20, 1)])
        out[key] = epochs
    return out


def _summarize_part(scores: list[dict[str, Any]]) -> dict[str, Any]:
    leaks = [s for s in scores if s["label"] == "leak" and s["twin_of"] is None]
    non = [s for s in scores if s["label"] != "leak" and s["twin_of"] is None]
    twins = [s for s in scores if s["twin_of"] is not None]
    named = [s for s in leaks if s["holder"] is not None]
    return {"leaks": len(leaks), "found": sum(s["found"] for s in leaks),
            "found_2nd": sum(s["found_2nd"] for s in leaks),
            "holders": len(named), "holder": sum(bool(s["holder"]) for s in named),
            "leak_kind": sum(s["kind"] for s in leaks),
            "non_leaks": len(non), "right_kind": sum(s["kind"] for s in non),
            "non_leaks_quiet": sum(s["quiet"] for s in non),
            "twins": len(twins), "twins_quiet": sum(s["ok"] for s in twins),
            "end_leaks": sum(s.get("end", False) for s in leaks),
            "end_non_leaks": sum(s.get("end", False) for s in non),
            "end_twins": sum(s.get("end", False) for s in twins)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per part of the reported corpus present in ``rows``: the counts of :func:`score`."""
    rep = [r["reported_score"] for r in rows if r.get("reported_score")]
    if not rep:
        return None
    return {split: _summarize_part([s for s in rep if s["split"] == split])
            for split in SPLITS if any(s["split"] == split for s in rep)}


def summary_line(m: dict[str, Any]) -> str:
    return (f"leaks found by the 2nd check {m['found_2nd']}/{m['leaks']} (by the deadline "
            f"{m['found']}/{m['leaks']}), holder named {m['holder']}/{m['holders']}, right kind "
            f"{m['leak_kind']}/{m['leaks']}; non-leaks of the right kind "
            f"{m['right_kind']}/{m['non_leaks']} (no leak verdict {m['non_leaks_quiet']}/"
            f"{m['non_leaks']}); fixed twins quiet {m['twins_quiet']}/{m['twins']}; at the end: "
            f"leaks believed {m['end_leaks']}/{m['leaks']}, non-leaks without one "
            f"{m['end_non_leaks']}/{m['non_leaks']}, twins without one "
            f"{m['end_twins']}/{m['twins']}")


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any] | None) -> None:
    if summary is None:
        return
    print()
    print("Reported-bug corpus (labels from the threads; benchmarks/scenarios/reported/README.md)")

    def yn(v: Any) -> str:
        return "-" if v is None else ("yes" if v else "NO")

    for split, m in summary.items():
        print(f"[{split}]")
        print(f"{'scenario':<30} {'label':<14} {'2nd chk':>7} {'found':>6} {'holder':>7} "
              f"{'kind':>5} {'twin':>6} {'end':>5}")
        for r in rows:
            s = r.get("reported_score")
            if not s or s["split"] != split:
                continue
            twin = yn(s.get("ok")) if s["twin_of"] else "-"
            print(f"{r['name']:<30} {s['label']:<14} {yn(s.get('found_2nd')):>7} "
                  f"{yn(s.get('found')):>6} {yn(s.get('holder')):>7} {yn(s.get('kind')):>5} "
                  f"{twin:>6} {yn(s.get('end')):>5}")
        print(f"{split}: {summary_line(m)}")
