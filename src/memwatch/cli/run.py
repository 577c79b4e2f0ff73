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

from memwatch.autorun.controller import GRACE_INTERVALS
from memwatch.autorun.launch import (
    SHIM_DIR,
    child_env,
    find_target,
    frameworks_imported,
    target_from,
)
from memwatch.autorun.plan import ENV, REPORT_CHOICES, Plan, Target
from memwatch.cli._base import Command
from memwatch.core.errors import ConfigError, MemwatchError
from memwatch.session import WatchConfig

__all__ = ["OPTIONS", "RunCommand", "parse_options"]

#: (flag, WatchConfig field, kind, help). Kinds: int, float, str; "?" also takes "none";
#: "off" is a flag setting the field False, "on" one setting it True; "frames" is --tracemalloc.
OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--out-dir", "out_dir", "str", "where bundles, the black box and report.html go"),
    ("--device", "device", "str", "auto (default), cpu, cuda, cuda:N or mps"),
    ("--check-every-n-steps", "check_every_n_steps", "int?",
     "a check (verdicts) every N optimizer steps (>= 16; default 5000; none: off)"),
    ("--check-every-s", "check_every_s", "float?",
     "... or every S seconds, whichever comes first (default 600; none: off)"),
    ("--total-steps", "total_steps", "int?",
     "the run's planned optimizer steps: a leak is a warning when it can kill the run"),
    ("--steps-per-epoch", "steps_per_epoch", "int?", "the epoch length, when known"),
    ("--horizon-s", "horizon_s", "float",
     "without --total-steps: growth reaching the limit within S seconds is a warning"),
    ("--tracemalloc", "tracemalloc", "frames",
     "trace Python allocations (8 frames, or FRAMES) to name leaks of plain Python objects"),
    ("--census", "census", "str", "live-tensor census at checks: auto (default), always, never"),
    ("--interval-s", "interval_s", "float", "background sampler period, seconds (default 1)"),
    ("--log-every-n-steps", "log_every_n_steps", "int",
     "how often sinks (W&B...) get a sample (default 50)"),
    ("--capacity", "capacity", "int", "raw samples kept in the ring (default 32768)"),
    ("--buckets-per-epoch", "buckets_per_epoch", "int", "bucket summaries per epoch (256)"),
    ("--bundle-on", "bundle_on", "str",
     "failures that write a bundle: oom (default: every OOM and peer_failure), all, none, or a "
     "comma list of cuda_oom, host_oom, mps_oom, peer_failure, other"),
    ("--bundle-report", "bundle_report", "str", "each bundle's report.html: auto, full, "
     "tables, none"),
    ("--max-bundles", "max_bundles", "int", "bundles kept in OUT_DIR/oom (default 20)"),
    ("--max-bundle-bytes", "max_bundle_bytes", "int", "one bundle is trimmed past this"),
    ("--max-total-bytes", "max_total_bytes", "int", "OUT_DIR/oom is kept under this"),
    ("--record-history", "record_history", "on", "record the CUDA allocator's history"),
    ("--blackbox-every-s", "blackbox_every_s", "float?",
     "how often the black box is rewritten (default 5; none: no black box)"),
    ("--exchange-timeout-s", "exchange_timeout_s", "float",
     "how long ranks wait for each other at checks (default 60)"),
    ("--distributed", "distributed", "str", "auto (default) or off: per-rank summaries at checks"),
    ("--warn", "warn", "on",
     "also raise a MemWatchWarning in the script per verdict (watch()'s warn=True)"),
    ("--no-host", "host", "off", "do not sample this process's memory"),
    ("--no-workers", "workers", "off", "do not sample DataLoader workers"),
    ("--no-analyze", "analyze", "off", "sample only: no verdicts"),
    ("--no-recorder", "recorder", "off", "no bundle when the script dies"),
    ("--no-signals", "signals", "off", "SIGTERM/SIGUSR1 write no bundle"),
    ("--no-watchdog", "watchdog", "off", "no thresholds or forecasts acting before the crash"),
)
_EXAMPLE = {"int": "5000", "int?": "5000 (or none)", "float": "600", "float?": "600 (or none)"}


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
    if kind.endswith("?") and str(raw).lower() == "none":
        return None
    if kind == "str":
        return raw
    try:
        return int(raw) if kind.startswith("int") else float(raw)
    except ValueError:
        what = "a whole number" if kind.startswith("int") else "a number"
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
                metavar = "N" if kind.startswith("int") else "S" if kind.startswith("float") \
                    else "DIR" if field == "out_dir" else field.upper()
                parser.add_argument(flag, dest=field, metavar=metavar, help=help_text)
        parser.add_argument("--report", choices=REPORT_CHOICES, default="full",
                            help="OUT_DIR/report.html at exit: full (charts, default), tables, "
                                 "none")
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
        if target is None:
            raise ConfigError(f"cannot tell which Python script {shlex.join(command)!r} trains "
                              "with; name it with --target train.py (or --target pkg.train)")
        if shutil.which(command[0]) is None:
            raise MemwatchError(f"{command[0]!r}: command not found (not on PATH, or not "
                                "executable)")
        plan = Plan(target, options, args.report)
        if args.dry_run:
            print(dry_run_text(command, plan, cwd), end="")
            return 0
        env = child_env(os.environ, plan)
        sys.stdout.flush()
        sys.stderr.flush()
        # exec: the script becomes this process (same pid, signals, exit code).
        os.execvpe(command[0], command, env)
        return 0  # pragma: no cover - exec does not return


def dry_run_text(command: list[str], plan: Plan, cwd: str) -> str:
    """What ``--dry-run`` prints: the target, what would be attached, the resolved options."""
    target: Target = plan.target
    imported = frameworks_imported(target, cwd)
    cfg = WatchConfig(**{"warn": False, **plan.options})  # memwatch run's warn default
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
    lines.append(f"  {'*' if plan.report != 'full' else ' '} report = {plan.report}  "
                 "(--report)")
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
    out.append("otherwise: every step of the first optimizer that steps (torch's optimizer step "
               f"hook), checks every {every if every is not None else '-'} steps / "
               f"{f'{secs:g}' if secs is not None else '-'} s")
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
