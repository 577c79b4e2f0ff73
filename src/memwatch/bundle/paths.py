"""Where a run writes: its ``out_dir`` resolved once into the folders under it
(:class:`OutputPaths`), and one folder per rank when several processes train (:func:`per_rank`).

Example::

    >>> from memwatch.bundle.paths import OutputPaths, per_rank
    >>> p = OutputPaths.resolve("/runs/a")
    >>> str(p.oom), str(p.blackbox), str(p.report)
    ('/runs/a/oom', '/runs/a/blackbox', '/runs/a/report.html')
    >>> per_rank("/runs/a", rank=3, world_size=8), per_rank("/runs/a", rank=0, world_size=1)
    ('/runs/a/rank3', '/runs/a')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from memwatch.bundle.blackbox import BLACKBOX_SUBDIR
from memwatch.bundle.format import END_OF_RUN_SUBDIR, OOM_SUBDIR

__all__ = ["REPORT_FILE", "WORKERS_SUBDIR", "OutputPaths", "per_rank"]

#: The HTML report of a run (``memwatch run`` writes it at exit).
REPORT_FILE = "report.html"
#: Where DataLoader workers answer their censuses (:mod:`memwatch.analysis.culprits.worker_census`).
WORKERS_SUBDIR = "workers"


def per_rank(out_dir: str, rank: int, world_size: int) -> str:
    """``out_dir`` for this process: ``<out_dir>/rank<N>`` when several processes train (each
    rank's bundles, black box and report apart), ``out_dir`` itself otherwise."""
    return os.path.join(out_dir, f"rank{rank}") if world_size > 1 else out_dir


@dataclasses.dataclass(frozen=True)
class OutputPaths:
    """The folders of one session's ``out_dir``, resolved once when it starts.

    Attributes:
        given: ``out_dir`` as configured (what messages and records show).
        root: the same, absolute: a later ``os.chdir`` moves nothing.
    """

    given: str
    root: Path

    @classmethod
    def resolve(cls, out_dir: str | os.PathLike[str]) -> OutputPaths:
        given = os.fspath(out_dir)
        return cls(given, Path(given).absolute())

    @property
    def oom(self) -> Path:
        """The flight recorder's bundles."""
        return self.root / OOM_SUBDIR

    @property
    def end_of_run(self) -> Path:
        """Bundles written at a clean end for the sinks (not failures)."""
        return self.root / END_OF_RUN_SUBDIR

    @property
    def blackbox(self) -> Path:
        """The black box's records."""
        return self.root / BLACKBOX_SUBDIR

    @property
    def workers(self) -> Path:
        """Where DataLoader workers answer their own censuses (one file each)."""
        return self.root / WORKERS_SUBDIR

    @property
    def report(self) -> Path:
        """The run's HTML report."""
        return self.root / REPORT_FILE
