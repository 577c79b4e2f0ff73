"""Layer 3, the on-disk formats memwatch writes and reads: the OOM bundle (:mod:`.format`, its
documents in :mod:`.documents`) and the timeline exports (:mod:`.export`)."""

from memwatch.bundle.format import (
    OPTIONAL_FILES,
    REQUIRED_FILES,
    SCHEMA_VERSION,
    TMP_PREFIX,
    Bundle,
    BundleWriter,
    clean_stale,
    dir_size,
    enforce_retention,
    find_bundles,
    host_name,
    open_bundle,
)

__all__ = [
    "OPTIONAL_FILES",
    "REQUIRED_FILES",
    "SCHEMA_VERSION",
    "TMP_PREFIX",
    "Bundle",
    "BundleWriter",
    "clean_stale",
    "dir_size",
    "enforce_retention",
    "find_bundles",
    "host_name",
    "open_bundle",
]
