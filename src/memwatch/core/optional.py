"""Optional dependencies: imported only by the module that needs them, with an install hint.

Example::

    >>> from memwatch.core.optional import require
    >>> require("json", extra="core", who="this example").__name__
    'json'
    >>> require("no_such_module_here", extra="report", who="memwatch.report")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ImportError: memwatch.report needs no_such_module_here; install it with pip install ...
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(*modules: str, extra: str, who: str) -> ModuleType:
    """The first of ``modules`` that imports (alternatives, e.g. a package's new and old name);
    else ImportError naming ``who``, what it needs and ``pip install 'memwatch[<extra>]'``."""
    err: ImportError | None = None
    for name in modules:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            err = e
    raise ImportError(f"{who} needs {modules[0].split('.')[0]}; install it with "
                      f"pip install 'memwatch[{extra}]'") from err
