"""A restricted unpickler for allocator snapshots: plain containers and scalars only.

PyTorch's allocator snapshots (``torch.cuda.memory._snapshot()``, ``_dump_snapshot``) are pickles
of dicts, lists, strings and numbers. The stdlib unpickler would run whatever callable a pickle
names (``os.system`` through ``__reduce__``), so a bundle received from someone else must never be
opened with it. This unpickler resolves no global at all except the two harmless constructors that
older pickle protocols use for sets, refuses persistent ids, and caps the input size.

It also bounds what comes out: a pickle can name one container many times (``BINGET``), so 24 KB
can stand for a list of 3,000 segments of 3,000 blocks each, which a renderer walking it would
expand into gigabytes. The loaded graph is walked once (iteratively): a non-empty container
reached twice, nesting deeper than :data:`MAX_DEPTH` or more than :data:`MAX_NODES` containers
refuse the pickle. Snapshots torch and memwatch write share no containers.

Example::

    >>> import pickle
    >>> from memwatch.core.safepickle import loads
    >>> loads(pickle.dumps({"segments": [{"size": 512, "blocks": ()}]}))
    {'segments': [{'size': 512, 'blocks': ()}]}
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from memwatch.core.errors import UnsafePickleError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "dump", "load", "loads"]

#: Snapshots larger than this are refused (a real one with history is tens of MiB).
MAX_BYTES = 1 << 30
#: Deepest nesting of containers accepted (a snapshot's is about 6).
MAX_DEPTH = 64
#: Most containers accepted in one snapshot.
MAX_NODES = 20_000_000

# Protocols 0-2 build sets and frozensets by calling these; calling them on a list runs no user
# code. Everything else (os.system, builtins.eval, getattr, any class) is refused.
_ALLOWED_GLOBALS = frozenset({("builtins", "set"), ("builtins", "frozenset"),
                              ("__builtin__", "set"), ("__builtin__", "frozenset")})


def _latin1_bytes(text: Any, encoding: Any = "latin1", errors: Any = "strict") -> bytes:
    # Protocols 0-2 write bytes as _codecs.encode(str, "latin1"); only that exact use is allowed.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise UnsafePickleError("snapshot pickle calls _codecs.encode in an unexpected way")
    return text.encode("latin-1")


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return set if name == "set" else frozenset
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        raise UnsafePickleError(
            f"snapshot pickle refers to {module}.{name}: only plain containers and scalars are "
            "allowed (this file was not written by memwatch or torch's snapshot, or was tampered "
            "with); it was not loaded"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("snapshot pickle uses persistent ids; only plain data is allowed")


def loads(data: bytes) -> Any:
    """Unpickle ``data`` allowing only plain containers and scalars.

    Raises :class:`memwatch.core.errors.UnsafePickleError` for anything else (a global, a class, a
    persistent id) and for a truncated or corrupted pickle; never executes code from ``data``.
    """
    if len(data) > MAX_BYTES:
        raise UnsafePickleError(f"snapshot pickle is {len(data)} bytes, over the {MAX_BYTES} cap")
    try:
        obj = _Restricted(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError, RecursionError, UnicodeDecodeError,
            OverflowError) as e:  # OverflowError: a FRAME or length opcode of 2**63 bytes
        raise UnsafePickleError(f"snapshot pickle is truncated or corrupted ({e})") from None
    _check_graph(obj)
    return obj


def _check_graph(obj: Any) -> None:
    """Refuse a graph that shares containers, nests too deep or holds too many containers."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    nodes = 0
    while stack:
        o, depth = stack.pop()
        if isinstance(o, dict):
            children: Any = (x for kv in o.items() for x in kv)
        elif isinstance(o, (list, tuple, set, frozenset)):
            children = o
        else:
            continue
        if not o:
            continue  # () and frozenset() are shared singletons: harmless
        if id(o) in seen:
            raise UnsafePickleError(
                "snapshot pickle refers to one container more than once: a small file that "
                "would expand into a huge graph (torch and memwatch never write that); it was "
                "not loaded")
        seen.add(id(o))
        nodes += 1
        if nodes > MAX_NODES or depth >= MAX_DEPTH:
            raise UnsafePickleError(
                f"snapshot pickle holds more than {MAX_NODES} containers or nests deeper than "
                f"{MAX_DEPTH}; it was not loaded")
        stack.extend((c, depth + 1) for c in children
                     if isinstance(c, (dict, list, tuple, set, frozenset)))


def load(path: str | os.PathLike[str]) -> Any:
    """Read (a regular file, not through a symlink, at most :data:`MAX_BYTES`) and
    :func:`loads` a file."""
    from memwatch.core.safefs import read_bounded

    try:
        data = read_bounded(path, MAX_BYTES)
    except OSError as e:
        raise UnsafePickleError(f"{os.fspath(path)}: {e}") from None
    return loads(data)


def dump(obj: Any, f: io.BufferedWriter | Any) -> None:
    """Pickle plain data to a binary file with a protocol whose containers need no globals.

    Protocol 4 frames the output in 64 KiB chunks, so writing streams instead of building the whole
    pickle in memory first (bundles are written when memory is scarce).
    """
    pickle.Pickler(f, protocol=4).dump(obj)
