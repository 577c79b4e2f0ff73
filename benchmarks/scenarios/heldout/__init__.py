"""Held-out reproductions of reported bugs (scored only by the benchmark, never by the tests)."""
