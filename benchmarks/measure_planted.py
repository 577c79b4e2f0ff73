"""What a reproduction really keeps per step: glibc's in-use bytes at every epoch end.

``planted_bytes_per_step`` of the reported scenarios (``benchmarks/scenarios/reported/README.md``)
is the growth of glibc's in-use bytes (``mallinfo2``: ``uordblks + hblkhd``, read after
``gc.collect()``) between the first and the last epoch ends of a quick run, divided by the steps
in between: what the bug keeps, without the heap holes and page granularity that move RSS. This
script runs one scenario in this process under ``memwatch.watch(analyze=False)`` (no census
perturbing the heap), reads those bytes at every ``end_epoch()``, and prints them beside the
epoch's RSS floor. ``mallinfo2`` covers the main arena only: memory allocated by other threads
is not in it (none of the corpus's loops allocates in threads), nor are Python's small objects
(512 bytes or less), which live in pymalloc's own mmapped arenas: for a leak of small Python
objects, ``--tracemalloc`` also reads the bytes traced by ``tracemalloc`` (every Python and numpy
allocation, no torch storage) at the same moments.

Not a benchmark of memwatch (``run_all.py`` runs ``bench_*.py`` only)::

    python benchmarks/measure_planted.py rep_memoize_cache            # quick sizes
    python benchmarks/measure_planted.py rep_memoize_cache --full
    python benchmarks/measure_planted.py rep_bpe_cache --tracemalloc
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import scenarios  # noqa: E402

MiB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def in_use_bytes() -> int:
    """glibc's bytes in use by the main arena and its mmapped chunks, after a full collection."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    m = libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


def measure(name: str, quick: bool = True, traced: bool = False) -> dict[str, Any]:
    import tracemalloc

    import memwatch

    mod = scenarios.load(name)
    sc = mod.SCENARIO
    epochs, steps = (sc.quick_epochs, sc.quick_steps) if quick else (sc.epochs,
                                                                      sc.steps_per_epoch)
    in_use: list[int] = []
    traced_bytes: list[int] = []
    if traced:
        tracemalloc.start()
    with tempfile.TemporaryDirectory(prefix="memwatch-measure-") as tmp, \
            memwatch.watch(device="cpu", workers=sc.workers, interval_s=0.05, out_dir=tmp,
                           analyze=False) as mw:
        real_end_epoch = mw.end_epoch

        def end_epoch() -> list[Any]:
            in_use.append(in_use_bytes())
            if traced:
                traced_bytes.append(tracemalloc.get_traced_memory()[0])
            return real_end_epoch()

        mw.end_epoch = end_epoch  # type: ignore[method-assign]
        mod.run(mw, epochs, steps)
        tl = mw.timeline
        assert tl is not None
        st, rss = tl.series("host.rss")
        floors = []
        for e in mw.epochs:
            vals = [v for s, v in zip(st.tolist(), rss.tolist(), strict=True)
                    if e.start_step <= s <= e.end_step]
            floors.append(min(vals))
    if traced:
        tracemalloc.stop()
    span = steps * (epochs - 1) if epochs > 1 else 1
    return {"name": name, "epochs": epochs, "steps": steps, "in_use": in_use,
            "rss_floors": floors, "in_use_per_step": (in_use[-1] - in_use[0]) / span,
            "traced": traced_bytes,
            "traced_per_step": (traced_bytes[-1] - traced_bytes[0]) / span if traced else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the scenario (see bench_detection.py --list)")
    ap.add_argument("--full", action="store_true", help="full sizes instead of --quick's")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="also read tracemalloc's traced bytes (small Python objects)")
    args = ap.parse_args(argv)
    r = measure(args.name, quick=not args.full, traced=args.tracemalloc)
    print(f"{r['name']}: {r['epochs']} epochs x {r['steps']} steps")
    for e, (u, f) in enumerate(zip(r["in_use"], r["rss_floors"], strict=True)):
        print(f"  epoch {e}: in use at its end {u / MiB:8.2f} MiB   RSS floor {f / MiB:8.2f} MiB")
    print(f"  in-use growth, first to last epoch end: {r['in_use_per_step']:.0f} B/step")
    if r["traced_per_step"] is not None:
        print(f"  traced by tracemalloc at epoch ends: "
              f"{[round(t / MiB, 2) for t in r['traced']]} MiB; growth "
              f"{r['traced_per_step']:.0f} B/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
