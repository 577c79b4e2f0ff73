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
    read the training thread's clock. The training thread waits on an event, not a sleep, so
    it is alive (its clock readable) whatever the machine's load (a 0.5-s sleep ended before
    the asking thread's burn on a loaded machine, and the question then read another clock)."""
    c = Costs(budget=0.01, floor_s=0.0)
    bound, release = threading.Event(), threading.Event()

    def train() -> None:
        c.bind()
        _burn(0.2)
        bound.set()
        release.wait()

    t = threading.Thread(target=train)
    t.start()
    try:
        assert bound.wait(60)
        _burn(0.2)  # this thread's own CPU is not the training thread's
        assert c.allows(0.0015) and not c.allows(0.003)
    finally:
        release.set()
        t.join()
    # The thread has ended: its clock is gone, its last reading stays the budget's base.
    assert c.allows(0.0015) and not c.allows(0.003)


def test_background_passes_do_not_spend_the_steps_budget() -> None:
    """Passes come every so many wall seconds: a loaded run (twice the wall time, twice the
    passes) must get the same answer for the same census as a quiet one."""
    answers = []
    for passes in (10, 20):  # quiet, loaded: the same training CPU, twice the passes
        ran = iter([0.0, *[10.0] * 4])
        c = Costs(budget=0.01, floor_s=0.0)
        c.bind(clock=lambda ran=ran: next(ran))  # type: ignore[misc]
        c.add("census", 0.5, cpu=0.05)
        for _ in range(passes):
            c.add("background reads", 0.004)
            c.add("black box", 0.001)
        answers.append((c.allows(0.04), c.allows(0.06)))
    assert answers == [(True, False), (True, False)]


def test_unbound_budget_counts_the_process_cpu_not_the_wall() -> None:
    cpu = [0.0]
    c = Costs(budget=0.01, floor_s=0.0, now=lambda: 1000.0, start=0.0,
              cpu_now=lambda: cpu[0])
    assert not c.allows(0.001)  # 1000 s of wall, no CPU: nothing to spend
    cpu[0] = 1.0
    assert c.allows(0.009) and not c.allows(0.011)


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
