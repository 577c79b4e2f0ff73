"""Synthetic plain Python/numpy leaks: what a new user's first leak looks like (a list of arrays,
a dict of log strings, a late-bounded deque, a bytearray with no torch at all)."""
