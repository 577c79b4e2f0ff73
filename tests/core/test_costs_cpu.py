"""The cost budget counts CPU time once the training thread is bound: a census that meets a busy
moment of a shared machine takes more wall time, not more work, and the decision must not move
with it (the corpus's hint censuses did, from one full run to the next)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from memwatch.core.costs import Costs


def _burn(cpu_seconds: float) -> None:
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def test_waiting_is_not_budget_working_is() -> None:
    c = Costs(budget=0.01, floor_s=0.0)
    c.bind()
    time.sleep(0.3)  # wall time passes, the thread does no work: no budget
    assert not c.allows(0.002)
    _burn(0.3)  # 0.3 CPU seconds of training: 3 ms of budget, however long it took
    assert c.allows(0.002) and not c.allows(0.004)
    c.add("census", 5.0, cpu=0.002)  # 5 s of wall (a loaded machine), 2 ms of work
    assert c.allows(0.0009) and not c.allows(0.0015)


def test_budget_counts_the_bound_thread_from_another() -> None:
    """The analyzer asks from the training thread, the background sampler from its own: both
    read the training thread's clock."""
    c = Costs(budget=0.01, floor_s=0.0)
    done = threading.Event()

    def train() -> None:
        c.bind()
        _burn(0.2)
        done.set()
        time.sleep(0.5)

    t = threading.Thread(target=train)
    t.start()
    done.wait(10)
    _burn(0.2)  # this thread's own CPU is not the training thread's
    assert c.allows(0.0015) and not c.allows(0.003)
    t.join()


def test_a_session_binds_its_training_thread(tmp_path: Path) -> None:
    import memwatch

    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path), signals=False) as mw:
        costs = mw._costs
        assert costs._clock is None
        mw.step()
        assert costs._clock is not None


def test_a_short_run_takes_no_optional_work_past_its_share() -> None:
    """No floor by default: a short run's optional work (a hint census after the baseline) is
    decided by 1% of its training CPU, which keeps a 12-s fit far from the edge, instead of by
    a quarter second it had nearly spent (its second census then hung on load)."""
    c = Costs(budget=0.01)
    c.bind()
    _burn(0.05)
    assert not c.allows(0.01)
    assert c.allows(0.0002)


def test_a_floor_given_is_kept() -> None:
    c = Costs(budget=0.01, floor_s=0.25)
    c.bind()
    _burn(0.05)
    assert c.allows(0.2) and not c.allows(0.3)
    c.add("census", 0.2, cpu=0.2)
    assert c.allows(0.04) and not c.allows(0.06)
