"""Which probes a session opens: the device its spec names (``"auto"`` looks without importing
torch), the host and the DataLoader workers; and the stand-in for a fast probe that failed."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.probes.base import DeviceProbe, Probe

log = logging.getLogger("memwatch")

__all__ = ["NanProbe", "open_probes", "resolve_device"]


def resolve_device(spec: Any) -> DeviceProbe | None:
    """The device probe for a normalised ``device=`` spec (a probe object is used as it is)."""
    if not isinstance(spec, str):
        return spec  # type: ignore[no-any-return]
    if spec == "cpu":
        return None
    name, _, idx = spec.partition(":")
    if spec == "auto":
        # Never import torch just to look: a run that trains with torch has imported it.
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            if torch.cuda.is_available():
                from memwatch.probes.cuda import CudaProbe

                return CudaProbe()
            if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
                from memwatch.probes.mps import MpsProbe

                return MpsProbe()
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: no accelerator probe (%s); watching host only", e)
        return None
    try:
        if name == "cuda":
            from memwatch.probes.cuda import CudaProbe

            return CudaProbe(int(idx) if idx else None)
        from memwatch.probes.mps import MpsProbe

        return MpsProbe()
    except (ImportError, RuntimeError) as e:
        raise ConfigError(
            f"device={spec!r} was asked for but is not usable here ({e}); use device=None to "
            "pick whatever is available, or device='cpu' to watch host memory only."
        ) from e


def open_probes(device: DeviceProbe | None, host: bool, workers: bool) -> list[Probe]:
    probes: list[Probe] = []
    if device is not None:
        probes.append(device)
    if host:
        from memwatch.probes.host import HostProbe

        probes.append(HostProbe())
        if sys.platform.startswith("linux"):
            from memwatch.probes.cgroup import CgroupProbe

            cg = CgroupProbe()
            if cg.slow_keys:
                probes.append(cg)  # the job's memory as the OOM killer counts it
            else:
                cg.close()
    if workers:
        from memwatch.probes.workers import WorkersProbe

        probes.append(WorkersProbe())
    return probes


class NanProbe:
    """Stands in for a disabled fast probe so the timeline keeps its columns (NaN)."""

    def __init__(self, failed: Probe) -> None:
        self.name = failed.name
        self.fast_keys = failed.fast_keys
        self.slow_keys: tuple[str, ...] = ()
        self._vals = (math.nan,) * len(failed.fast_keys)

    def read_fast(self) -> Sequence[float]:
        return self._vals

    def read_slow(self) -> dict[str, float]:
        return {}

    def limits(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None
