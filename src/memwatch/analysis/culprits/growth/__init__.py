"""Stage 2 of finding a culprit: what the growth between two censuses is, in bytes (containers
weighed, allocation sites weighed against host growth, device tensors joined to their allocation
sites)."""
