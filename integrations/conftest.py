"""End-to-end suites that drive each real framework (one folder per adapter).

Each folder mirrors a module of ``src/memwatch/integrations/`` (``integrations/lightning/`` for
``memwatch.integrations.lightning``, ...) and runs the framework for real on CPU. Shared fixtures
for those suites go here; the doctest ``tmp`` name comes from the repository's root conftest.
"""
