"""Thin adapters from training frameworks to :class:`memwatch.MemWatch`.

Each submodule imports its framework when imported; a missing extra raises ImportError naming the
``pip install 'memwatch[...]'`` that fixes it.
"""
