"""Whose code and whose objects: the one answer to "is this the user's?" and "is this memwatch's
own?", which every culprit search asks.

* **memwatch's own** (never a culprit, never a holder): files under the installed package
  (:data:`OWN_DIR`), modules named ``memwatch`` or ``memwatch.*``, their types and their frames.
  memwatch's own objects (samples, findings, the censuses kept for the next diff) grow with the
  run by design.
* **the user's** (a holder worth naming, an allocation site worth showing): code that is not the
  standard library, not an installed package (``site-packages``/``dist-packages``) and not
  memwatch. Scripts, notebooks (``<ipython-input…>``, ``<string>``) and a project's own packages
  installed in development mode (``pip install -e``) are the user's.
* the import system's and tracemalloc's own allocations are nobody's culprit.

Example::

    >>> import json
    >>> from memwatch.analysis.culprits.census import ownership
    >>> ownership.is_user_file(json.__file__), ownership.is_own_file(ownership.__file__)
    (False, True)
    >>> ownership.is_user_file("<stdin>"), ownership.is_own_module_name("memwatch.session")
    (True, True)
"""

from __future__ import annotations

import collections
import functools
import importlib
import os
import sys
import sysconfig
import tracemalloc
import types
from typing import Any

__all__ = ["OWN_DIR", "excluded", "is_framework_object", "is_own_file", "is_own_module_name",
           "is_own_object", "is_own_type", "is_user_file", "is_user_module", "is_user_type",
           "library_prefixes", "module_file"]


def _package_dir() -> str:
    """The top package's directory, found by going up as many levels as this module's name has
    dots (so it stays right when this module moves inside the package)."""
    path = os.path.abspath(__file__)
    for _ in range(__name__.count(".")):
        path = os.path.dirname(path)
    return path + os.sep


#: The directory of the memwatch package (``…/memwatch/``), with a trailing separator.
OWN_DIR = _package_dir()

_TRACEMALLOC_FILE = os.path.abspath(tracemalloc.__file__ or "tracemalloc.py")
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__ or "importlib")) + os.sep
_PACKAGE_MARKERS = ("site-packages", "dist-packages")


def library_prefixes() -> tuple[str, ...]:
    """The standard library's and the installed packages' directories of this interpreter."""
    paths = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            p = sysconfig.get_paths().get(name)
        except Exception:  # noqa: BLE001 - an odd installation: fall back on the markers
            p = None
        if p:
            paths.add(os.path.abspath(p) + os.sep)
    return tuple(sorted(paths))


_LIBRARY = library_prefixes()


def is_own_file(filename: str) -> bool:
    """A file of memwatch's own package."""
    return filename.startswith(OWN_DIR)


def is_own_module_name(name: str) -> bool:
    return name == "memwatch" or name.startswith("memwatch.")


def is_own_type(tp: type) -> bool:
    """A class memwatch defines (its instances are memwatch's bookkeeping)."""
    mod = getattr(tp, "__module__", None)
    return isinstance(mod, str) and is_own_module_name(mod)


@functools.lru_cache(maxsize=4096)
def excluded(filename: str) -> bool:
    """memwatch's own allocations, tracemalloc's and the import system's are never a culprit."""
    return (is_own_file(filename) or filename == _TRACEMALLOC_FILE
            or filename.startswith("<frozen importlib") or filename.startswith(_IMPORTLIB_DIR))


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Code the user wrote: not the standard library, an installed package or memwatch."""
    if filename.startswith("<"):
        return not filename.startswith(("<frozen", "<unknown"))  # "<string>", "<stdin>": user
    if any(m in filename for m in _PACKAGE_MARKERS) or excluded(filename):
        return False  # (installed packages first: most of a run's modules and frames)
    return not filename.startswith(_LIBRARY)


def module_file(mod: Any) -> str | None:
    """The file of a module (None: a builtin). A script's ``__main__`` loses its ``__file__``
    once the script has run (CPython removes it): at exit its loader still names the file."""
    f = getattr(mod, "__file__", None)
    if f is None and getattr(mod, "__name__", None) == "__main__":
        f = getattr(getattr(mod, "__loader__", None), "path", None)
    return f if isinstance(f, str) else None


def is_user_module(mod: Any) -> bool:
    """A module of the user's code (a module without a file, a builtin, is not)."""
    f = module_file(mod)
    return f is not None and _is_user_path(f)


@functools.lru_cache(maxsize=4096)
def _is_user_path(path: str) -> bool:
    # A run's first census asks of its ~1,000 types' modules some 3,000 times: os.path.abspath
    # each time was 15-20 ms of it. (A module's file names an absolute path in any Python this
    # package supports, so the working directory cannot change the answer.) A path that is
    # already absolute and normal is taken as it is (abspath was 9 ms of a first census's 25
    # ms of such questions): only one with a "." or ".." part or a doubled separator is
    # normalised, since those are what could move it in or out of a directory.
    if os.sep != "/" or not path.startswith("/") or "//" in path or "/./" in path or \
            "/../" in path or path.endswith(("/.", "/..")):
        path = os.path.abspath(path)
    return is_user_file(path)


_user_type: dict[type, bool] = {}


def is_user_type(tp: type) -> bool:
    """A class defined in a module of the user's code (cached per class)."""
    r = _user_type.get(tp)
    if r is None:
        mod = sys.modules.get(getattr(tp, "__module__", "") or "")
        r = _user_type[tp] = mod is not None and is_user_module(mod)
    return r


def is_own_object(obj: Any) -> bool:
    """memwatch's own object, module, function, bound method, closure or cache: never a holder
    and never a culprit (memwatch's hooks and wrappers hold what they watch: an adapter's
    closure reaches the trainer, which is the user's; the route through it is not).

    Example::

        >>> from memwatch.analysis.culprits.census import ownership
        >>> ownership.is_own_object(ownership.is_user_file), ownership.is_own_object(len)
        (True, False)
    """
    tp = type(obj)
    if is_own_type(tp):
        return True
    if tp is types.FunctionType or tp is types.ModuleType:
        return is_own_module_name(getattr(obj, "__module__", None) or
                                  getattr(obj, "__name__", "") or "")
    if tp is types.MethodType:
        return is_own_object(obj.__func__) or is_own_type(type(obj.__self__))
    if tp.__name__ == "_lru_cache_wrapper" or tp is functools.partial:
        # a cache or a partial of memwatch's own function (``ownership.excluded``)
        fn = getattr(obj, "__wrapped__", None) or getattr(obj, "func", None)
        return fn is not None and is_own_object(fn)
    return False


#: Types that are never framework bookkeeping: the plain containers, code and its pieces.
_PLAIN = (list, dict, tuple, set, frozenset, collections.deque, types.FunctionType,
          types.FrameType,
          types.ModuleType, type, types.CellType, types.MethodType, types.TracebackType,
          BaseException)


def is_framework_object(obj: Any) -> bool:
    """An instance of a library's class that is not a model: a framework's bookkeeping
    (``Trainer.state``, an ``EvalPrediction``, Lightning's result collections, an optimizer).
    A holder walk passes through such an object only when no user container refers to the
    same object (the user's list that keeps the arrays, not the framework's record of them).
    Containers, functions and frames are nobody's bookkeeping; an ``nn.Module`` is the user's
    model whoever wrote its class; memwatch's own objects are another question
    (:func:`is_own_object`)."""
    tp = type(obj)
    if isinstance(obj, _PLAIN) or tp.__name__ == "_lru_cache_wrapper":
        return False
    if is_user_type(tp) or is_own_type(tp) or tp.__name__ in ("ndarray", "memmap"):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and isinstance(obj, (torch.nn.Module, torch.Tensor)))
