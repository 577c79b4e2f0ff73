"""``memwatch run``'s start-up shim: Python's ``site`` imports this module as ``sitecustomize``
in every process started with the environment ``memwatch run`` prepared (this folder leads
``PYTHONPATH``; the plan is JSON in ``MEMWATCH_RUN``).

It imports only what the interpreter has already loaded (no memwatch, no torch), and:

* runs the user's own ``sitecustomize`` (the next one on ``sys.path``), as Python would have
  (``sys.modules["sitecustomize"]`` is then the user's), and takes its folder off ``sys.path``;
* in a process that is not the training script's (the launcher, DataLoader workers, compile
  workers, pip...), does nothing else;
* in the training script's process, installs post-import hooks: when torch, Lightning's
  ``Trainer``, transformers' ``Trainer`` or Accelerate's ``Accelerator`` is imported, it loads
  :mod:`memwatch.autorun.controller`, which attaches what fits. No framework is ever imported
  here: the hooks fire only when the script imports one.

Nothing here raises into the script: a failure prints one line and the process runs unwatched.
Imported under its package name (``memwatch.autorun.shim.sitecustomize``, as the tests do), it
does nothing but define the functions below.

Example::

    >>> from memwatch.autorun.shim.sitecustomize import main_of
    >>> main_of(["-m"], ["python", "-u", "-m", "pkg.train", "--lr", "1"])
    ('module', 'pkg.train')
    >>> main_of(["-c"], ["python", "-c", "pass"]) is None
    True
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at start-up

if TYPE_CHECKING:  # nothing more is imported at start-up than the interpreter already has
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

#: The environment variable holding the plan (JSON; :mod:`memwatch.autorun.plan` names it too:
#: this module imports no other, so the name is written twice and a test keeps them equal).
ENV = "MEMWATCH_RUN"
HERE = os.path.dirname(os.path.abspath(__file__))

#: The modules whose import matters: torch (the optimizer hook), and the modules that define
#: Lightning's and transformers' ``Trainer`` and Accelerate's ``Accelerator``.
WATCHED = ("torch", "lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer",
           "transformers.trainer", "accelerate.accelerator")


def python_main(args: Sequence[str]) -> tuple[str, str | None, int]:
    """What ``python ARGS`` runs: ``("script", path, i)`` or ``("module", name, i)`` (``i``: the
    index of the argument after it), or ``("none", None, i)`` for ``-c`` and the REPL."""
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-") or a == "-":
            return ("script", a, i) if a != "-" else ("none", None, i)
        if a.startswith("--"):
            i += a == "--check-hash-based-pycs"
            continue
        for j, ch in enumerate(a[1:], 1):  # combined flags: -u, -um mod, -mmod, -Werror
            if ch in "mcWX":
                rest = a[j + 1:]
                if ch == "c":
                    return "none", None, len(args)
                if ch == "m":
                    if rest:
                        return "module", rest, i
                    return ("module", args[i], i + 1) if i < len(args) else ("none", None, i)
                i += not rest  # -W/-X take the next argument when none is attached
                break
    return "none", None, len(args)


def main_of(argv: Sequence[str], orig_argv: Sequence[str]) -> tuple[str, str] | None:
    """What this interpreter runs: ``("script", real path)``, ``("module", name)``, or None
    (``-c``, the REPL, stdin). ``sys.argv`` is already set when ``sitecustomize`` runs; for
    ``-m`` it is ``["-m", ...]`` until runpy finds the module, so the name comes from
    ``sys.orig_argv``."""
    if not argv or argv[0] in ("", "-", "-c"):
        return None
    if argv[0] != "-m":
        return "script", os.path.realpath(argv[0])
    kind, what, _ = python_main(orig_argv[1:])
    return ("module", what) if kind == "module" and what else None


def is_target(plan: Any, argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Is this process the one the plan watches (its ``target``: a script path or a module)?"""
    target = plan.get("target") if isinstance(plan, dict) else None
    if not isinstance(target, dict):
        return False
    main = main_of(argv, orig_argv)
    if main is None:
        return False
    kind, what = main
    want = target.get(kind)
    if not isinstance(want, str):
        return False
    return what == (os.path.realpath(want) if kind == "script" else want)


class _Loader:
    """Runs the real loader, then the hook (the module's ``__loader__`` stays the real one)."""

    def __init__(self, real: Any, hook: Callable[[str, ModuleType], None]) -> None:
        self.real, self.hook = real, hook

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None:  # the module says its real loader, as without this hook
            spec.loader = self.real
        module.__loader__ = self.real
        self.real.exec_module(module)
        self.hook(module.__name__, module)


class PostImport:
    """A meta-path finder that calls ``hook(name, module)`` once each watched module has been
    imported (it finds nothing itself: the next finder's spec is used, its loader wrapped)."""

    def __init__(self, names: Sequence[str], hook: Callable[[str, ModuleType], None]) -> None:
        self.pending = set(names)
        self.hook = hook

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.pending:  # every import of the process passes here: one set lookup
            return None
        self.pending.discard(name)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None) if finder is not self else None
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.hook)
                return spec
        return None


def _chain_user_sitecustomize() -> None:
    """Run the ``sitecustomize`` Python would have found without this folder, if there is one."""
    from importlib.machinery import PathFinder  # frozen at start-up: costs nothing

    here = os.path.realpath(HERE)
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return  # (this module stays in sys.modules: the import that runs it looks it up there)
    # importlib.util.module_from_spec, without importing importlib.util (3 ms) at every start.
    mod = spec.loader.create_module(spec) or type(sys)("sitecustomize")
    mod.__spec__, mod.__loader__ = spec, spec.loader
    if spec.origin and spec.has_location:
        mod.__file__ = spec.origin
    if spec.cached:
        mod.__dict__["__cached__"] = spec.cached
    sys.modules["sitecustomize"] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop("sitecustomize", None)  # as a failed import leaves it
        raise


def _leave_sys_path() -> None:
    here = os.path.realpath(HERE)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]


def _say(what: str) -> None:
    try:
        print(f"memwatch run: {what}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - no stderr: nothing to say it on
        pass


class _Boot:
    """The training script's side: the post-import hooks and the controller they load."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.controller: Any = None
        self.failed = False

    def on_import(self, name: str, module: ModuleType) -> None:
        if self.failed:
            return
        try:
            if self.controller is None:
                from memwatch.autorun.controller import Controller

                self.controller = Controller(self.plan)
            self.controller.on_import(name, module)
        except Exception as e:  # noqa: BLE001 - the script must run, watched or not
            self.failed = True
            hint = "; is memwatch installed for this Python?" \
                if isinstance(e, ImportError) and "memwatch" in str(e) else ""
            _say(f"this process is not watched ({type(e).__name__}: {e}){hint}")


def boot(environ: Any = os.environ) -> _Boot | None:
    """What runs at start-up; returns the boot object in the training script's process."""
    text = environ.get(ENV)
    failure: BaseException | None = None
    try:
        _chain_user_sitecustomize()
    except Exception as e:  # noqa: BLE001 - re-raised below, for site to report as usual
        failure = e
    _leave_sys_path()
    got: _Boot | None = None
    try:
        plan = None
        if text:
            import json

            plan = json.loads(text)
        if isinstance(plan, dict) and is_target(plan, sys.argv,
                                                getattr(sys, "orig_argv", sys.argv)):
            got = _Boot(plan)
            sys.meta_path.insert(0, PostImport(WATCHED, got.on_import))
            # A watched module imported already (by the user's sitecustomize, a .pth file).
            for name in WATCHED:
                if name in sys.modules:
                    got.on_import(name, sys.modules[name])
    except Exception as e:  # noqa: BLE001
        _say(f"this process is not watched ({type(e).__name__}: {e})")
    if failure is not None:
        raise failure
    return got


if __name__ == "sitecustomize":
    boot()
