"""``memwatch run`` end to end: the scripts of ``examples/run/`` run unmodified, bare and under
``memwatch run``, in real interpreters (helpers in ``run_helpers.py``)."""

from __future__ import annotations

import sys

import pytest

if not sys.platform.startswith("linux"):  # exec, RLIMIT_AS, /proc
    pytest.skip("memwatch run's end-to-end suite runs on Linux", allow_module_level=True)
