"""Stage 3 of finding a culprit: who keeps the growth alive (the holder walk up the referrers, the
frames and names it reads, the bounds a holder carries itself, the DataLoaders that keep
workers)."""
