"""WorkersProbe against real DataLoader worker processes (persistent and not) and process churn."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import memwatch
from memwatch.probes.workers import WorkersProbe

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class _SlowSquares(Dataset[Any]):
    """Enough work per item that an epoch spans several background-sampler passes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.002)
        return torch.tensor([float(i * i)])


def _workers_probe(mw: memwatch.MemWatch) -> WorkersProbe:
    (probe,) = [p for p in mw.probes if p.name == "workers"]
    assert isinstance(probe, WorkersProbe)
    return probe


def _wait_until_seen(mw: memwatch.MemWatch, pids: set[int], timeout: float = 10.0) -> None:
    """Keep stepping until the background thread has read every one of ``pids``."""
    probe = _workers_probe(mw)
    deadline = time.monotonic() + timeout
    while not pids <= probe.seen_pids:
        assert time.monotonic() < deadline, f"workers {pids - probe.seen_pids} never sampled"
        mw.step()
        time.sleep(0.01)
    for _ in range(15):  # a few more passes so a sample carries the complete reading
        mw.step()
        time.sleep(0.01)


def _wait_until_gone(pids: set[int], hang_s: float = 120.0) -> None:
    """Until none of ``pids`` is a child of this process any more: a non-persistent loader's
    workers exit after its epoch, and on a loaded machine the next epoch's workers started
    before they had (4 workers counted, each reading right)."""
    end = time.monotonic() + hang_s
    while pids & {c.pid for c in psutil.Process().children()}:
        assert time.monotonic() < end, "the previous epoch's workers never exited"
        time.sleep(0.01)


@pytest.mark.parametrize("persistent", [True, False])
def test_real_dataloader_workers_are_found_and_measured(persistent: bool, tmp_path: Path) -> None:
    loader = DataLoader(_SlowSquares(40), batch_size=2, num_workers=2,
                        persistent_workers=persistent)
    epochs = 2
    pids_per_epoch: list[set[int]] = []
    counts: list[float] = []
    uss: list[float] = []
    pss: list[float] = []
    rss: list[float] = []
    with memwatch.watch(device="cpu", interval_s=0.05, out_dir=tmp_path) as mw:
        for _ in range(epochs):
            it = iter(loader)
            # Reading a private attribute of torch's iterator, only to learn the true pids.
            pids = {w.pid for w in it._workers}  # type: ignore[attr-defined]
            pids_per_epoch.append(pids)
            first = True
            for _batch in it:
                if first:
                    _wait_until_seen(mw, pids)
                    first = False
                mw.step()
                latest = mw.latest()
                counts.append(latest["workers.count"])
                uss.append(latest["workers.uss"])
                pss.append(latest["workers.pss"])
                rss.append(latest["workers.rss"])
            details = mw.worker_details()
            mw.end_epoch()
            if not persistent:
                del it
                _wait_until_gone(pids)
        seen = _workers_probe(mw).seen_pids
    assert max(counts) == 2
    assert max(uss) > 0 and max(pss) > 0
    assert max(pss) <= max(rss)  # PSS splits the copy-on-write pages that RSS counts twice
    assert all(p in seen for pids in pids_per_epoch for p in pids)
    if persistent:
        assert pids_per_epoch[0] == pids_per_epoch[1]
        assert len(seen) == 2
        assert sorted(d["index"] for d in details) == [0, 1]
    else:
        assert not pids_per_epoch[0] & pids_per_epoch[1], "non-persistent workers get new pids"
        assert len(seen) == 2 * epochs


def test_worker_churn_and_custom_matcher() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = WorkersProbe(is_worker=lambda pid: pid == child.pid)
        deadline = time.monotonic() + 5
        while child.pid not in probe.discover():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        got = probe.read_slow()
        assert got["workers.count"] == 1 and got["workers.uss"] > 0
        assert got["workers.max_uss"] == got["workers.uss"]
        assert [d["pid"] for d in probe.per_worker()] == [child.pid]
        # A process without children has no workers (the default matcher, another parent).
        assert WorkersProbe(parent_pid=child.pid).read_slow()["workers.count"] == 0
    finally:
        child.kill()
        child.wait()
    got = probe.read_slow()  # the worker is gone: no error, just nobody to count
    assert got["workers.count"] == 0
    # no worker, no reading: NaN sums (a 0 would drag the analyzer's floors to zero)
    assert all(math.isnan(got[k]) for k in ("workers.rss", "workers.uss", "workers.pss"))
    assert probe.per_worker() == []
    assert probe.read_fast() == ()

