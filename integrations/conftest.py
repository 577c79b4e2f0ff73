"""End-to-end suites that drive each real framework (one folder per adapter).

Each folder mirrors a module of ``src/memwatch/integrations/`` (``integrations/lightning/`` for
``memwatch.integrations.lightning``, ...) and runs the framework for real on CPU. Shared fixtures
for those suites go here; the doctest ``tmp`` name comes from the repository's root conftest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest


def _check_resumed(mw: Any, before: Any, steps: int, first_findings: Sequence[Any],
                   findings: Sequence[Any], texts: Sequence[str]) -> None:
    """What every adapter's resume test asserts about the resumed session ``mw``: the epoch saved
    before the restart (``before``) is back, unchanged; one step axis across the restart; the host
    leak is confirmed at the first epoch end after it (``findings``, warned in ``texts``); and the
    findings of the first run (``first_findings``) are kept once, not reported again."""
    import json

    assert mw is not None and mw.timeline is not None
    assert [e.epoch for e in mw.epochs] == [0, 1]
    restored, new = mw.epochs
    assert restored.n_steps == before.n_steps == steps
    assert restored.bucket_floor is not None and before.bucket_floor is not None
    # (NaN where a metric has no value, e.g. cgroup.limit in a cgroup without one: equal too)
    assert np.array_equal(restored.bucket_floor, before.bucket_floor, equal_nan=True)
    # One step axis across the restart.
    assert new.start_step == restored.end_step + 1 and new.n_steps == steps
    assert mw.step_count == 2 * steps
    # Only one epoch ran in this process: the verdict needs the epoch from before the restart.
    leaks = [f for f in findings if f.kind == "leak" and f.metric.startswith("host.")]
    col = mw.timeline.keys.index("host.rss")
    floors = [(e.epoch, e.floor[col] / 2**20) for e in mw.epochs]
    assert leaks, (floors, _judged(mw, "host.rss"), [f.to_dict() for f in findings])
    assert all(f.epoch == 1 and f.step == 2 * steps for f in leaks)
    assert any("leak in host." in t for t in texts), texts
    # What was found before the restart is kept, once: the replay reported nothing again.
    old = [f.to_dict() for f in findings if f.epoch == 0]
    assert old == json.loads(json.dumps([f.to_dict() for f in first_findings]))


def _judged(mw: Any, metric: str) -> list[tuple[Any, ...]]:
    """What the analyzer judged of ``metric``, unit by unit (MiB): for a failure's message."""
    an = getattr(mw, "analyzer", None)
    hist = [*getattr(an, "history", {}).get(metric, []),
            *getattr(an, "segments", {}).get(metric, [])]
    mib = 2.0**20
    return [(h.unit, h.shape, round(h.floor / mib, 1), round(h.rise / mib, 1),
             round(h.threshold / mib, 1), round(h.own_churn / mib, 1), h.n_points) for h in hist]


@pytest.fixture
def check_resumed() -> Callable[..., None]:
    """:func:`_check_resumed`, for the resume suites of every adapter."""
    return _check_resumed


@pytest.fixture
def judged() -> Callable[[Any, str], list[tuple[Any, ...]]]:
    """:func:`_judged`: what the analyzer judged of a metric, for a failure's message."""
    return _judged
