"""Layer 3, the on-disk formats memwatch writes and reads: the OOM bundle (:mod:`.format`
writes it, :mod:`.reader` reads it trusting nothing, :mod:`.schema` gives its fields' types; its
documents in :mod:`.documents`, the housekeeping of a bundle folder in :mod:`.retention`) and the
timeline exports (:mod:`.export`). The bundle's names are importable from here
(``from memwatch.bundle import open_bundle``)."""

from memwatch.bundle import format as _format
from memwatch.bundle import reader as _reader
from memwatch.bundle import retention as _retention
from memwatch.bundle.format import *  # noqa: F403 - the format's public names, as its __all__
from memwatch.bundle.reader import *  # noqa: F403
from memwatch.bundle.retention import *  # noqa: F403

__all__ = [*_format.__all__, *_reader.__all__, *_retention.__all__]
