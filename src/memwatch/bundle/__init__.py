"""Layer 3, the on-disk formats memwatch writes and reads: the OOM bundle (:mod:`.format`, its
documents in :mod:`.documents`) and the timeline exports (:mod:`.export`). The bundle format's
names are importable from here (``from memwatch.bundle import open_bundle``)."""

from memwatch.bundle.format import *  # noqa: F403 - the format's public names, as its __all__
from memwatch.bundle.format import __all__ as __all__  # noqa: PLC0414
