"""Stage 3 of finding a culprit: who keeps the growth alive (the holder walk up the referrers, the
frames and names it reads, the DataLoaders that keep workers)."""
