"""The parent's side of ``memwatch run``: which process is the training script
(:func:`find_target` reads the command: ``python train.py``, ``python -m pkg.train``,
``torchrun ... train.py``, ``accelerate launch ...``), the environment that carries the plan
(:func:`child_env`), and the script's imports for ``--dry-run`` (:func:`frameworks_imported`,
read with ``ast``: nothing runs).

Example::

    >>> from memwatch.autorun.launch import find_target
    >>> find_target(["python", "-m", "pkg.train", "--lr", "1"], cwd=".")
    Target(script=None, module='pkg.train')
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from memwatch.autorun.plan import ENV, Plan, Target
from memwatch.autorun.shim.sitecustomize import HERE, python_main
from memwatch.core.errors import ConfigError

__all__ = ["FRAMEWORKS", "SHIM_DIR", "child_env", "find_target", "frameworks_imported",
           "target_from"]

#: The folder put first on ``PYTHONPATH`` (it holds the ``sitecustomize`` shim).
SHIM_DIR = HERE
#: Launchers whose workers run the training script (``python -m`` of these is a launcher too).
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                     "accelerate.commands.launch", "accelerate.commands.accelerate_cli",
                     "deepspeed.launcher.runner")
_PYTHON = re.compile(r"^python[0-9.]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: What ``--dry-run`` looks for in the script's imports.
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate",
              "wandb")
_MAX_SOURCE_BYTES = 4 << 20


def child_env(environ: Mapping[str, str], plan: Plan) -> dict[str, str]:
    """The command's environment: the plan, and the shim's folder first on ``PYTHONPATH``."""
    env = dict(environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = SHIM_DIR + (os.pathsep + old if old else "")
    env[ENV] = plan.encode()
    return env


# --------------------------------------------------------------------------- the target
def _is_python(arg: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(arg)))


def _launched_script(args: Sequence[str], cwd: str) -> Target | None:
    """A launcher's training script: its first argument naming an existing ``.py`` file, else
    the module after its last ``-m``/``--module``."""
    for a in args:
        if a.endswith(".py") and os.path.isfile(os.path.join(cwd, a)):
            return Target(script=os.path.realpath(os.path.join(cwd, a)))
    mods = [args[k + 1] for k, a in enumerate(args[:-1]) if a in ("-m", "--module")
            and _MODULE.match(args[k + 1])]
    return Target(module=mods[-1]) if mods else None


def find_target(command: Sequence[str], cwd: str) -> Target | None:
    """The training script of ``command``, or None when it cannot be told (``--target``).

    ``python [options] SCRIPT`` or ``python -m MODULE``; for a launcher (``torchrun``,
    ``accelerate launch``, ``python -m torch.distributed.run``, ``deepspeed``, ``uv run``...)
    the first argument naming an existing ``.py`` file, else the module after its last ``-m``.
    """
    if not command:
        return None
    head, rest = command[0], list(command[1:])
    if _is_python(head):
        kind, what, after = python_main(rest)
        if kind == "script" and what is not None:
            return Target(script=os.path.realpath(os.path.join(cwd, what)))
        if kind == "module" and what is not None:
            if what in _LAUNCHER_MODULES:
                return _launched_script(rest[after:], cwd)
            return Target(module=what)
        return None
    if head.endswith(".py") and os.path.isfile(os.path.join(cwd, head)):
        return Target(script=os.path.realpath(os.path.join(cwd, head)))  # ./train.py
    return _launched_script(rest, cwd)


def target_from(value: str, cwd: str) -> Target:
    """``--target``: an existing file is a script, a dotted name a module; else ConfigError."""
    path = os.path.join(cwd, value)
    if os.path.isfile(path):
        return Target(script=os.path.realpath(path))
    if _MODULE.match(value):
        return Target(module=value)
    raise ConfigError(f"--target {value!r} is neither a file nor a module name; pass the "
                     "training script's path (train.py) or its module (pkg.train)")


# --------------------------------------------------------------------------- --dry-run
def _source_of(target: Target, cwd: str) -> Path | None:
    if target.script:
        return Path(target.script)
    parts = str(target.module).split(".")
    for base in [cwd, *[p for p in sys.path if p]]:
        for cand in (Path(base, *parts).with_suffix(".py"), Path(base, *parts, "__main__.py")):
            if cand.is_file():
                return cand
    return None


def frameworks_imported(target: Target, cwd: str) -> list[str] | None:
    """The frameworks of :data:`FRAMEWORKS` the training script imports (read with ``ast``,
    nothing is run), or None when its source cannot be read."""
    import ast

    path = _source_of(target, cwd)
    try:
        if path is None or not path.is_file() or path.stat().st_size > _MAX_SOURCE_BYTES:
            return None
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found.update(n.split(".")[0] for n in names)
    return [f for f in FRAMEWORKS if f in found]
