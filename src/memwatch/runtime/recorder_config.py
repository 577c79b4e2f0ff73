"""The flight recorder's options: :class:`RecorderConfig` and the ``bundle_on=`` parser."""

from __future__ import annotations

import dataclasses
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.core.oom import KINDS, OOM_KINDS, PEER_FAILURE
from memwatch.core.safefs import modes

__all__ = ["DEFAULT_BUNDLE_ON", "REPORT_MODES", "RecorderConfig", "parse_bundle_on"]

MIB = 1 << 20
REPORT_MODES: tuple[str, ...] = ("auto", "full", "tables", "none")
#: ``bundle_on="oom"``: every OOM class, and a collective that failed because another rank died
#: (in a distributed job that is how the first rank's OOM reaches the others; a job's story
#: compares every rank, so each one writes its bundle).
DEFAULT_BUNDLE_ON: tuple[str, ...] = (*OOM_KINDS, PEER_FAILURE)


def parse_bundle_on(value: Any) -> frozenset[str]:
    """``"oom"`` (default: every OOM class and ``peer_failure``, see :data:`DEFAULT_BUNDLE_ON`),
    ``"all"``, ``"none"``, or a collection of ``"oom"``, ``"cuda_oom"``, ``"host_oom"``,
    ``"mps_oom"``, ``"peer_failure"``, ``"other"``."""
    names = {"oom": DEFAULT_BUNDLE_ON, "all": KINDS, "none": (), **{k: (k,) for k in KINDS}}
    items = [value] if isinstance(value, str) else value
    try:
        items = list(items) if items is not None else []
    except TypeError:
        items = [value]
    out: set[str] = set()
    for it in items:
        if not isinstance(it, str) or it not in names:
            raise ConfigError(
                f"bundle_on={value!r}: {it!r} is not a trigger; use 'oom' (default), 'all', "
                f"'none' or a tuple of {sorted(names)}."
            )
        out.update(names[it])
    return frozenset(out)


@dataclasses.dataclass(frozen=True)
class RecorderConfig:
    """Flight-recorder options (``MemWatch(recorder=..., bundle_on=..., ...)``).

    Defaults: bundles on every OOM class and on a collective that failed because another rank
    died; at most 20 bundles and 1 GiB in ``<out_dir>/oom``; one
    bundle trimmed to 256 MiB (largest optional files first); 2000 timeline rows; census top 20.

    Example::

        >>> from memwatch.runtime.recorder_config import RecorderConfig, parse_bundle_on
        >>> cfg = RecorderConfig(bundle_on=parse_bundle_on(("host_oom", "other")), max_bundles=5)
        >>> sorted(cfg.bundle_on), cfg.max_total_bytes // 2**30
        (['host_oom', 'other'], 1)
    """

    enabled: bool = True
    bundle_on: frozenset[str] = frozenset(DEFAULT_BUNDLE_ON)
    max_bundles: int = 20
    max_bundle_bytes: int = 256 * MIB
    max_total_bytes: int = 1024 * MIB
    record_history: bool = False
    signals: bool = True
    timeline_rows: int = 2000
    census_top_n: int = 20
    #: report.html in each bundle: "full" (charts, plotly.js inlined: about 5 MB), "tables" (a few
    #: KiB; ``memwatch report BUNDLE`` draws the charts later), "none", or "auto": full, except
    #: tables for the bundles a distributed job's survivors write when the launcher stops them or
    #: their collective fails (signal and peer_failure bundles of a rank in a world of more than
    #: one: 1,024 of them would be 5 GB).
    report: str = "auto"
    #: Who may read the bundles: "private" (dirs 0700, files 0600) or "group" (0750/0640; see
    #: :func:`memwatch.core.safefs.modes` and ``docs/security.md``).
    share: str = "private"

    def __post_init__(self) -> None:
        modes(self.share)  # ConfigError naming share= and its values
        if self.report not in REPORT_MODES:
            raise ConfigError(f"bundle_report={self.report!r}: use one of "
                              f"{', '.join(map(repr, REPORT_MODES))}.")
        for name, lo in (("max_bundles", 1), ("max_bundle_bytes", 4096),
                         ("max_total_bytes", 4096), ("timeline_rows", 0),
                         ("census_top_n", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"{name}={v!r} must be an int >= {lo}.")
        if self.max_total_bytes < self.max_bundle_bytes:
            raise ConfigError(
                f"max_total_bytes={self.max_total_bytes} is below max_bundle_bytes="
                f"{self.max_bundle_bytes}; raise max_total_bytes or lower max_bundle_bytes."
            )
