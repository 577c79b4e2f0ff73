"""The folder ``memwatch run`` puts first on ``PYTHONPATH``: its ``sitecustomize`` module is what
Python imports at start-up in every process of the watched command (see
:mod:`memwatch.autorun.shim.sitecustomize`)."""
