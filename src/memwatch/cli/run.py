"""Run a training script under memwatch without editing it.

    memwatch run [OPTIONS] -- python train.py ARGS...
    memwatch run [OPTIONS] -- torchrun --nproc-per-node 2 train.py ARGS...
    memwatch run [OPTIONS] -- accelerate launch train.py ARGS...
    memwatch run [OPTIONS] -- python -m pkg.train ARGS...

Every Python process that runs the training script (each rank a launcher starts) is watched;
the launcher, DataLoader workers and other helper processes are not. In it, memwatch attaches
itself to what the script creates: a MemWatchCallback in each Lightning or transformers Trainer
(unless its callbacks have one), the Accelerate hook at the first step of an Accelerator's loop,
and otherwise every step of the first optimizer that steps (a plain loop: verdicts at checks
every --check-every-n-steps steps or --check-every-s seconds). A script with no optimizer step
is sampled every --interval-s seconds instead. A script that runs memwatch itself is left alone.

You get: verdict lines on stderr as checks make them, a bundle under OUT_DIR/oom when the script
dies of memory (OUT_DIR/blackbox for a kill), OUT_DIR/report.html and a summary at exit, and the
W&B panels when the script logs to W&B. The script's exit code, stdout and behaviour are its own.

OUT_DIR is --out-dir (one folder per rank when several processes train), else what the adapter
uses (Lightning: <default_root_dir>/memwatch; transformers: <output_dir>/memwatch; Accelerate and
plain loops: ./memwatch). Options mirror memwatch.watch()'s and are validated the same way: a bad
value exits 2 before the script starts. --dry-run prints what would be attached and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from typing import Any

from memwatch.autorun.controller import GRACE_INTERVALS, RUN_DEFAULTS
from memwatch.autorun.launch import (
    SHIM_DIR,
    child_env,
    find_target,
    frameworks_imported,
    target_from,
)
from memwatch.autorun.plan import ENV, Plan, Target
from memwatch.cli._base import Command
from memwatch.core.errors import ConfigError, MemwatchError
from memwatch.session import WatchConfig
from memwatch.session.config import flags

__all__ = ["OPTIONS", "RunCommand", "missing_script", "parse_options"]

#: (flag, WatchConfig field, kind, help), in the options' order: made from the options'
#: declarations (:func:`memwatch.session.config.flags`), never written out here. Kinds: int,
#: float, str; "?" also takes "none"; "off" is a flag setting the field False, "on" one setting
#: it True; "frames" is --tracemalloc.
OPTIONS: tuple[tuple[str, str, str, str], ...] = tuple(
    (flag.name, field, flag.kind, flag.help) for flag, field in flags())
_EXAMPLE = {"int": "5000", "int?": "5000 (or none)", "float": "600", "float?": "600 (or none)",
            "steps": "5000 (or auto, or none)"}


def _convert(flag: str, kind: str, raw: Any) -> Any:
    """The value of ``flag`` as the option's type; ConfigError naming the flag and the fix."""
    if kind in ("on", "off"):
        return kind == "on"
    if kind == "frames":
        if raw is True:
            return True
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{flag} {raw!r} is not a number of frames; use {flag} alone "
                              f"(8 frames) or {flag} 16, and put -- before the command") from None
    if kind in ("int?", "float?", "steps") and str(raw).lower() == "none":
        return None
    if kind == "steps" and str(raw).lower() == "auto":
        return "auto"
    if kind == "str":
        return raw
    try:
        return int(raw) if kind.startswith("int") or kind == "steps" else float(raw)
    except ValueError:
        what = "a whole number" if kind.startswith("int") or kind == "steps" else "a number"
        raise ConfigError(f"{flag} {raw!r} is not {what}; e.g. {flag} {_EXAMPLE[kind]}") from None


def parse_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`memwatch.MemWatch` options given on the command line, each validated as
    ``memwatch.watch()`` validates it (ConfigError naming the flag and the fix)."""
    options: dict[str, Any] = {}
    for flag, field, kind, _ in OPTIONS:
        raw = getattr(args, field)
        if raw is None:
            continue
        value = _convert(flag, kind, raw)
        if field == "bundle_on" and isinstance(value, str) and "," in value:
            value = [v.strip() for v in value.split(",") if v.strip()]
        try:
            WatchConfig(**{"device": "cpu", field: value})
        except ConfigError as e:
            raise ConfigError(f"{flag} {raw if raw is not True else ''}: {e}".replace(" :", ":"))\
                from None
        options[field] = value
    try:
        WatchConfig(**options)  # the options together
    except ConfigError as e:
        raise ConfigError(f"the options together: {e}") from None
    return options


class RunCommand(Command):
    """Run COMMAND (python train.py, torchrun ..., accelerate launch ...) with every process of
    the training script watched: no code change."""

    name = "run"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for flag, field, kind, help_text in OPTIONS:
            if kind in ("on", "off"):
                parser.add_argument(flag, dest=field, action="store_const", const=True,
                                    help=help_text)
            elif kind == "frames":
                parser.add_argument(flag, dest=field, nargs="?", const=True, metavar="FRAMES",
                                    help=help_text)
            else:
                metavar = "N" if kind.startswith("int") or kind == "steps" else \
                    "S" if kind.startswith("float") else "DIR" if field == "out_dir" else \
                    field.upper()
                parser.add_argument(flag, dest=field, metavar=metavar, help=help_text)
        parser.add_argument("--target", metavar="SCRIPT|MODULE",
                            help="the training script's path or module, when the command does "
                                 "not show it (found by itself for python, torchrun, accelerate "
                                 "launch)")
        parser.add_argument("--dry-run", action="store_true",
                            help="print what would be attached and the options, run nothing")
        parser.add_argument("to_run", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                            help="the command to run, after --")

    def run(self, args: argparse.Namespace) -> int:
        command = list(args.to_run)
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            raise ConfigError("no command to run; use memwatch run [OPTIONS] -- python train.py")
        options = parse_options(args)
        cwd = os.getcwd()
        target = target_from(args.target, cwd) if args.target else find_target(command, cwd)
        missing = missing_script(command, target, cwd)
        if missing is not None:
            raise ConfigError(f"{missing!r}: no such file (from {cwd}); check the script's path "
                              "in the command")
        if target is None:
            raise ConfigError(f"cannot tell which Python script {shlex.join(command)!r} trains "
                              "with; name it with --target train.py (or --target pkg.train)")
        if shutil.which(command[0]) is None:
            raise MemwatchError(f"{command[0]!r}: command not found (not on PATH, or not "
                                "executable)")
        plan = Plan(target, options)
        if args.dry_run:
            print(dry_run_text(command, plan, cwd), end="")
            return 0
        env = child_env(os.environ, plan)
        sys.stdout.flush()
        sys.stderr.flush()
        # exec: the script becomes this process (same pid, signals, exit code).
        os.execvpe(command[0], command, env)
        return 0  # pragma: no cover - exec does not return


def missing_script(command: list[str], target: Target | None, cwd: str) -> str | None:
    """The script the command names that does not exist (``python nope.py``, ``nope.py``,
    ``torchrun ... nope.py``), else None."""
    if target is not None:
        if target.script and not os.path.isfile(target.script):
            return os.path.relpath(target.script, cwd)
        return None
    return next((a for a in command if a.endswith(".py") and not a.startswith("-")
                 and not os.path.isfile(os.path.join(cwd, a))), None)


def dry_run_text(command: list[str], plan: Plan, cwd: str) -> str:
    """What ``--dry-run`` prints: the target, what would be attached, the resolved options."""
    target: Target = plan.target
    imported = frameworks_imported(target, cwd)
    cfg = WatchConfig(**{**RUN_DEFAULTS, **plan.options})  # memwatch run's own defaults
    given = set(plan.options)
    lines = ["memwatch run --dry-run: nothing was started.",
             f"command:  {shlex.join(command)}",
             f"watched:  each Python process running {target.describe()} (every rank a "
             "launcher starts; not the launcher, DataLoader workers or other helpers)"]
    if imported is None:
        lines.append("imports:  unknown (the source could not be read)")
    else:
        names = ", ".join(imported) or "none of torch, lightning, transformers, accelerate, wandb"
        lines.append(f"imports:  {names} (read from its source; nothing ran)")
    lines.append("attaches, in that process:")
    lines += [f"  - {text}" for text in _attaches(imported, cfg)]
    lines.append("options (memwatch.WatchConfig; * = given here):")
    for flag, field, _, _ in OPTIONS:
        value: Any = getattr(cfg, field)
        if field == "watchdog":
            value = value is not None
        elif field == "bundle_on":
            value = ",".join(sorted(value)) or "none"
        elif field == "out_dir" and field not in given:
            value = "(the adapter's default; ./memwatch for a plain loop)"
        lines.append(f"  {'*' if field in given else ' '} {field} = {value}  ({flag})")
    lines.append(f"environment: PYTHONPATH={SHIM_DIR}{os.pathsep}...; {ENV}={plan.encode()}")
    return "\n".join(lines) + "\n"


def _attaches(imported: list[str] | None, cfg: WatchConfig) -> list[str]:
    """What the controller would attach, given the frameworks the script imports."""
    known = imported if imported is not None else ["lightning", "transformers", "accelerate"]
    out = []
    if "lightning" in known or "pytorch_lightning" in known:
        out.append("Lightning: a memwatch.integrations.lightning.MemWatchCallback added to each "
                   "Trainer it creates (unless its callbacks hold one)")
    if "transformers" in known:
        out.append("transformers: a memwatch.integrations.transformers.MemWatchCallback added "
                   "to each Trainer it creates (unless its callbacks hold one)")
    if "accelerate" in known:
        out.append("Accelerate: memwatch.integrations.accelerate.attach() on the optimizer, at "
                   "its first step, when an Accelerator exists")
    every = cfg.check_every_n_steps
    secs = cfg.check_every_s
    steps = ("sized to the run (steps 100, 200 ... 3,200, then every 5,000)" if every == "auto"
             else f"every {every if every is not None else '-'} steps")
    out.append("otherwise: every step of the first optimizer that steps (torch's optimizer step "
               f"hook), checks {steps} / every {f'{secs:g}' if secs is not None else '-'} s, "
               "and a last word at exit")
    grace = GRACE_INTERVALS * cfg.sample_every_s
    out.append(f"no optimizer step and no Trainer {grace:g} s after torch is imported: a sample "
               f"every {cfg.sample_every_s:g} s until an optimizer steps")
    if imported is not None and "torch" not in imported and not (
            {"lightning", "pytorch_lightning", "transformers", "accelerate"} & set(imported)):
        out.append("(the script does not import torch itself: nothing is attached unless a "
                   "module it imports does)")
    out.append("a MemWatch the script starts itself (watch(), attach()) is left alone: "
               "nothing is added")
    return out
