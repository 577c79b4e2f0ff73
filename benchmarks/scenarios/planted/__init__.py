"""Planted leaks in real training loops: each module keeps memory the way a known bug class does
(a loss kept with its graph, a hook storing outputs, an unbounded cache, a stored traceback)."""
