"""Layer 0, the vocabulary every other layer speaks: errors, units, findings, metric names and
logger keys, the classification of out-of-memory failures, redaction and the restricted
unpickler. Imports nothing else of memwatch (see ``docs/architecture.md``)."""
