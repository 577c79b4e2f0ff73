"""Weights & Biases: memwatch's charts, findings, leak forecasts and bundles in the user's run.

:class:`WandbSink` writes into the run the user already has and never creates one. It finds it,
in this order: the ``run=`` it was given (a ``wandb`` run, a Lightning ``WandbLogger``, the
transformers ``WandbCallback``, an Accelerate wandb tracker), else ``wandb.run``. It imports
nothing: when wandb was never imported by the program there can be no run, and the sink does
nothing. A rank without a run (DDP ranks > 0 under Lightning) does nothing either; a rank with
its own run logs its own series, whose keys carry the rank when ``world_size > 1``
(``memwatch/rank1/host.rss_gib``).

What lands in the run (every key, and what each panel shows: ``docs/wandb.md``):

* per-sample series under ``memwatch/`` (one section of panels), keyed to ``memwatch/step`` (the
  optimizer step) through ``define_metric``, with ``max`` summaries for memory levels;
* at every check (:meth:`WandbSink.on_check`: epoch ends and checks inside epochs, training and
  evaluation loops) ``memwatch/findings/...`` counts and rates, the ``memwatch/findings_table``
  (one row per finding of every loop, cumulative), a ``memwatch/leak/<metric>`` chart per leaking
  metric (check floors, fitted trend, forecast to the limit), ``run.summary`` fields (verdict,
  peaks, worst forecast) and, when the run is online, one ``run.alert`` per critical finding;
* every flight-recorder bundle (already redacted) as an artifact of type ``memwatch-oom`` (an
  OOM) or ``memory-snapshot`` (anything else, including the end-of-run report that the sink asks
  for when the run had a warning or a confirmed leak), plus its ``report.html`` as
  ``memwatch/report``.

Everything shown is derived from what the sink is given: the samples (``on_metrics``), the check
reports (their findings and the summary judged) and the bundles with their committed manifest.
The sink never reads a bundle's files except to upload those the manifest lists.

Example (an offline run; ``docs/wandb.md`` shows how to read it back)::

    >>> import os, wandb, memwatch
    >>> from memwatch.sinks.wandb import WandbSink
    >>> os.environ["WANDB_MODE"] = "offline"
    >>> run = wandb.init(project="memwatch-demo", dir=str(tmp))
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp),
    ...                     sinks=[WandbSink()], log_every_n_steps=5) as mw:
    ...     for _ in range(10):
    ...         mw.step()
    >>> run.finish()
"""

from __future__ import annotations

import collections
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memwatch.analysis.beliefs import describe, history, state_of
from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding
from memwatch.core.metrics import (
    FINDING_COLUMNS,
    PREFIX,
    finding_row,
    findings_metrics,
    is_count,
    to_log_metrics,
)
from memwatch.core.protocols import CheckReport
from memwatch.core.units import GIB, fmt_bytes
from memwatch.runtime.warn import NOTICE_KINDS, warning_text

__all__ = ["WandbSink", "find_run"]

log = logging.getLogger("memwatch")

_OOM_CLASSES = ("cuda_oom", "host_oom", "mps_oom")
_FINAL_CHOICES = ("findings", "always", "never")
_MAX_TABLE_ROWS = 500
_MAX_CHECKS = 64  # floors kept per metric for the leak charts
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _is_run(obj: Any) -> bool:
    # A real wandb run, not a stand-in such as Lightning's DummyExperiment on ranks > 0 (which
    # answers every attribute with a no-op).
    return obj is not None and type(obj).__module__.startswith("wandb") and \
        callable(getattr(obj, "log", None)) and hasattr(obj, "summary")


def find_run(source: Any = None) -> tuple[Any, str]:
    """The user's wandb run and where it came from, or ``(None, "")``; never creates a run.

    ``source`` may be a run, a Lightning ``WandbLogger`` (its ``experiment``), the transformers
    ``WandbCallback``, an Accelerate tracker (``run``/``tracker``), or ``None`` (``wandb.run``).
    """
    wandb = sys.modules.get("wandb")
    if wandb is None:
        return None, ""  # never imported by the program: there is no run to find
    if source is None:
        run = getattr(wandb, "run", None)
        return (run, "wandb.run") if _is_run(run) else (None, "")
    if _is_run(source):
        return source, "run"
    name = type(source).__name__
    if name == "WandbLogger" or hasattr(source, "experiment"):
        exp = getattr(source, "experiment", None)  # Lightning: creates the logger's own run
        if _is_run(exp):
            return exp, "lightning"
    if name == "WandbCallback" or hasattr(source, "_wandb"):
        run = getattr(getattr(source, "_wandb", None), "run", None)
        if _is_run(run):
            return run, "transformers"
    for attr in ("run", "tracker"):  # Accelerate's WandBTracker (unwrap=False)
        run = getattr(source, attr, None)
        if _is_run(run):
            return run, "accelerate"
    return None, ""


def _finished(run: Any) -> bool:
    return bool(getattr(run, "_is_finished", False))


class WandbSink:
    """Writes memwatch's samples, findings and bundles into the user's W&B run.

    Args:
        run: where to find the run (see :func:`find_run`); ``None`` uses ``wandb.run`` when a
            run exists. Resolved lazily, so the sink may be created before ``wandb.init``.
        stage: ``"train"`` (keys ``memwatch/...``) or ``"val"``/``"test"`` (``memwatch/val/...``).
        commit: ``True``: each memwatch sample is its own history row. ``False``: it joins the
            trainer's current row and never moves the run's step (needed when the trainer logs
            with explicit ``step=`` values, as Accelerate does). ``None`` (default): ``False``
            for a run found through an Accelerate tracker, ``True`` otherwise.
        series: log the per-step series and the findings counts and table. ``False`` when a
            framework adapter already writes those through its own logger (the transformers
            callback and the Accelerate hook do): the sink then adds only what they cannot
            (leak charts, summary, alerts, artifacts, report), without a second copy of a key.
        charts: log a leak chart per leaking metric at epoch ends.
        alerts: ``run.alert`` once per critical finding (kind, metric), online runs only.
        artifacts: upload bundles as artifacts.
        final_snapshot: when the session closes without an uploaded bundle, ask it for one
            end-of-run bundle (HTML report, snapshot): ``"findings"`` (after a warning or
            critical finding, or a confirmed leak of any severity; default), ``"always"`` or
            ``"never"``.
    """

    def __init__(self, run: Any = None, *, stage: str = "train", commit: bool | None = None,
                 series: bool = True, charts: bool = True, alerts: bool = True,
                 artifacts: bool = True, final_snapshot: str = "findings") -> None:
        if stage not in ("train", "val", "test", "predict"):
            raise ConfigError(f"stage={stage!r}: use 'train', 'val', 'test' or 'predict'.")
        if final_snapshot not in _FINAL_CHOICES:
            raise ConfigError(f"final_snapshot={final_snapshot!r}: use one of {_FINAL_CHOICES}.")
        self.source = run
        self.stage = stage
        self.commit = commit
        self.series = bool(series)
        self.charts = bool(charts)
        self.alerts = bool(alerts)
        self.artifacts = bool(artifacts)
        self.final_snapshot = final_snapshot
        self.run: Any = None
        self.found_via = ""
        self.closed = False
        #: Names of the artifacts logged (``name:type``), for the user and the tests.
        self.logged_artifacts: list[str] = []
        self.alerts_sent: list[str] = []
        self._prefix = PREFIX
        self._rank = 0
        self._world = 1
        self._defined: set[str] = set()
        self._peaks: dict[str, float] = {}
        #: (stage, metric) -> (end step, floor) of the checks the sink was given.
        self._floors: dict[tuple[str, str], collections.deque[tuple[int, float]]] = {}
        self._rows: collections.deque[list[Any]] = collections.deque(maxlen=_MAX_TABLE_ROWS)
        #: Every belief's current finding, and its changes (``state``, ``epoch``, ``step``...).
        self._current: dict[str, Finding] = {}
        self._changes: dict[str, list[dict[str, Any]]] = {}
        self._n_findings = 0
        self._alerted: set[tuple[str, str]] = set()
        self._uploaded = False

    # ------------------------------------------------------------------ the run
    def _get_run(self) -> Any:
        run = self.run
        if run is not None:
            return None if _finished(run) else run
        run, via = find_run(self.source)
        if run is None or _finished(run):
            return None
        self.run, self.found_via = run, via
        from memwatch.runtime.exchange import rank_info

        info = rank_info()
        self._rank, self._world = info["rank"], info["world_size"]
        self._prefix = PREFIX if self._world <= 1 else f"{PREFIX}/rank{self._rank}"
        step_key = self._step_key
        run.define_metric(step_key, hidden=True)
        self._defined.add(step_key)
        return run

    @property
    def _step_key(self) -> str:
        return f"{self._prefix}/step" if self.stage == "train" else \
            f"{self._prefix}/{self.stage}/step"

    def _commit(self) -> bool:
        if self.commit is not None:
            return self.commit
        return self.found_via != "accelerate"

    def _define(self, run: Any, keys: Sequence[str]) -> None:
        for k in keys:
            if k in self._defined:
                continue
            self._defined.add(k)
            if k.endswith(("_gib", "_mib_per_step")):
                summary = "max"  # a memory level's summary is its peak
            elif k.endswith(("steps_to_oom", "_seconds_to_oom_s")):
                summary = "min"  # the most urgent forecast
            else:
                summary = "last"
            run.define_metric(k, step_metric=self._step_key, summary=summary)

    def _log(self, run: Any, data: dict[str, Any], step: int) -> None:
        data[self._step_key] = step
        self._define(run, [k for k, v in data.items() if isinstance(v, (int, float))])
        run.log(data, commit=self._commit())

    # ------------------------------------------------------------------ sink protocol
    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        for metric, value in sample.items():
            if value is not None and not math.isnan(value) and not is_count(metric):
                if value > self._peaks.get(metric, -math.inf):
                    self._peaks[metric] = float(value)
        if not self.series:
            return
        run = self._get_run()
        if run is None:
            return
        self._log(run, to_log_metrics(sample, stage=self.stage, prefix=self._prefix), step)

    def on_check(self, report: CheckReport) -> None:
        """A check of any loop: its findings join the table, the verdict and the alerts; the
        counts and leak charts are logged under that loop's keys (counts only for this sink's
        own stage: a framework logger writes the evaluation loops' counts)."""
        self._remember(report)
        for f in report.findings:
            self._n_findings += 1
            key = f.belief or f"{f.stage}/{f.metric}/{f.kind}"
            self._current.pop(key, None)
            self._current[key] = f
            changes = self._changes.setdefault(key, [])
            changes += [c for c in history([f], key)
                        if not changes or c["state"] != changes[-1]["state"]]
        # The table shows the current verdicts, one row per belief, with their history.
        self._rows.clear()
        self._rows.extend(finding_row(f, f.stage, self._history(k))
                          for k, f in self._current.items())
        run = self._get_run()
        if run is None:
            return
        wandb = sys.modules["wandb"]
        findings, step = report.findings, int(report.step)
        data: dict[str, Any] = {}
        head = self._head(report.stage)
        if self.series and report.stage == self.stage:
            data.update(findings_metrics(findings, stage=self.stage, prefix=self._prefix))
        if findings and self.series:
            data[f"{self._head()}/findings_table"] = wandb.Table(
                columns=list(FINDING_COLUMNS), data=[list(r) for r in self._rows])
        if self.charts:
            for f in findings:
                if f.kind == "leak" and f.bytes_per_step:
                    chart = self._leak_chart(wandb, f)
                    if chart is not None:
                        data[f"{head}/leak/{f.metric}"] = chart
        if data:
            self._log(run, data, step)
        run.summary.update(self._summary_fields())
        self._alert(run, findings)

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        run = self._get_run()
        if run is None or not self.artifacts:
            return
        wandb = sys.modules["wandb"]
        path, doc = Path(path), manifest  # the manifest committed with the bundle (SinkSet)
        cls = str(doc.get("classification") or "")
        oom = cls in _OOM_CLASSES
        kind = "memwatch-oom" if oom else "memory-snapshot"
        name = f"{'memwatch-oom' if oom else 'memwatch-snapshot'}-{_safe(str(run.id))}"
        if self._world > 1:
            name += f"-rank{self._rank}"
        peaks = _raised(self._peaks, doc.get("latest"))  # + the last sample before the failure
        meta = {
            "trigger": doc.get("trigger"), "classification": doc.get("classification"),
            "reason": doc.get("reason"), "exception_type": doc.get("exception_type"),
            "rank": doc.get("rank", self._rank), "world_size": doc.get("world_size", self._world),
            "step": doc.get("step"), "epoch": doc.get("epoch"), "bundle": path.name,
            "created_utc": doc.get("created_utc"), "memwatch_version": doc.get("memwatch_version"),
            "peak_bytes": dict(sorted(peaks.items())),
            "peak": {k: fmt_bytes(v) for k, v in sorted(peaks.items())},
        }
        art = wandb.Artifact(name, type=kind, metadata=meta,
                             description=f"memwatch bundle ({doc.get('trigger')}): {path.name}")
        # Only the bundle's own files, which the recorder redacted before writing them; never
        # whatever else might sit in that directory.
        files = doc.get("files")
        names = sorted(files) if isinstance(files, Mapping) else []
        for rel in ["manifest.json", *names]:
            f = path / rel
            if f.is_file() and f.resolve().is_relative_to(path.resolve()):
                art.add_file(str(f), name=rel)
        run.log_artifact(art)
        self.logged_artifacts.append(f"{name}:{kind}")
        self._uploaded = True
        head = self._head()
        data: dict[str, Any] = {f"{head}/oom": 1.0} if oom else {}
        report = path / "report.html"
        if report.is_file() and "report.html" in names:
            data[f"{head}/report"] = wandb.Html(str(report), inject=False)
        if data:
            self._log(run, data, int(doc.get("step") or 0))
        run.summary.update({f"{head}/bundle": f"{name} ({kind})",
                            f"{head}/bundle_trigger": str(doc.get("trigger"))})

    @property
    def wants_final_bundle(self) -> bool:
        """Whether the closing session should write an end-of-run bundle for this sink."""
        if self._uploaded or not self.artifacts or self.final_snapshot == "never":
            return False
        if self._get_run() is None:
            return False
        # Warnings and leaks believed now (one withdrawn since is no reason for a snapshot).
        return self.final_snapshot == "always" or any(_counts(f) for f in
                                                      self._current.values())

    def close(self) -> None:
        # The run is the user's: it is not finished here, only no longer written to.
        self.closed = True
        run = self.run
        if run is not None and not _finished(run):
            run.summary.update(self._summary_fields())

    # ------------------------------------------------------------------ content
    def _head(self, stage: str | None = None) -> str:
        stage = stage or self.stage
        return self._prefix if stage == "train" else f"{self._prefix}/{stage}"

    def _remember(self, report: CheckReport) -> None:
        """The judged summary's floors (for the leak charts) and, for this sink's stage, its
        peaks."""
        summary = report.summary
        if summary is None:
            return
        end = int(summary.end_step)
        for i, k in enumerate(summary.keys):
            if is_count(k):
                continue
            floor, peak = float(summary.floor[i]), float(summary.peak[i])
            if report.stage == self.stage and not math.isnan(peak) and \
                    peak > self._peaks.get(k, -math.inf):
                self._peaks[k] = peak
            if not math.isnan(floor):
                dq = self._floors.setdefault((report.stage, k),
                                             collections.deque(maxlen=_MAX_CHECKS))
                dq.append((end, floor))

    def _leak_chart(self, wandb: Any, f: Finding) -> Any:
        floors = list(self._floors.get((f.stage, f.metric), ()))
        if not floors or not f.bytes_per_step:
            return None
        xs_f = [float(s) for s, _ in floors]
        ys_f = [v / GIB for _, v in floors]
        last_x, last_y = floors[-1]
        slope = float(f.bytes_per_step)
        first_x = xs_f[0]
        xs: list[list[float]] = [xs_f, [first_x, last_x]]
        ys: list[list[float]] = [ys_f, [(last_y + slope * (first_x - last_x)) / GIB,
                                        last_y / GIB]]
        keys = ["epoch floor", "fitted trend"]
        limit = f.evidence.get("limit_bytes")
        peak = f.evidence.get("peak_bytes") or self._peaks.get(f.metric, last_y)
        if f.steps_to_oom is not None and math.isfinite(f.steps_to_oom) and limit:
            end = last_x + float(f.steps_to_oom)
            xs.append([last_x, end])
            ys.append([float(peak) / GIB, float(limit) / GIB])
            keys.append("forecast")
            xs.append([first_x, end])
            ys.append([float(limit) / GIB, float(limit) / GIB])
            keys.append("limit")
        rate = fmt_bytes(slope)
        title = f"memwatch: {f.metric} leak, {rate}/step"
        if f.steps_to_oom is not None and math.isfinite(f.steps_to_oom):
            title += f", OOM in ~{f.steps_to_oom:,.0f} steps"
        return wandb.plot.line_series(xs=xs, ys=ys, keys=keys, title=title,
                                      xname="step (GiB on y)")

    def _history(self, key: str) -> str | None:
        changes = self._changes.get(key) or []
        return describe(changes) if len(changes) > 1 else None

    def _summary_fields(self) -> dict[str, Any]:
        head = self._head()
        out: dict[str, Any] = {f"{head}/findings_total": self._n_findings}
        # The verdict is the current beliefs' (a leak whose growth stopped no longer counts;
        # it is listed as withdrawn, with its history).
        worst = sorted((f for f in self._current.values() if _counts(f)),
                       key=lambda f: (-_rank(f), f.steps_to_oom or math.inf))
        gone = [f"{f.metric}: {self._history(k)}" for k, f in self._current.items()
                if state_of(f) != "leak" and
                any(c["state"] == "leak" for c in self._changes.get(k, []))]
        if gone:
            out[f"{head}/verdicts_withdrawn"] = gone[-8:]
        if worst:
            out[f"{head}/verdict"] = _verdict(worst[0])
            out[f"{head}/verdict_kinds"] = sorted({f"{f.kind}:{f.metric}" for f in worst})
        else:
            out[f"{head}/verdict"] = "ok"
        forecasts = [f for f in worst if f.severity != "info" and f.steps_to_oom is not None
                     and math.isfinite(f.steps_to_oom)]
        if forecasts:
            f = min(forecasts, key=lambda x: float(x.steps_to_oom or math.inf))
            out[f"{head}/worst_steps_to_oom"] = float(f.steps_to_oom or 0)
            if f.seconds_to_oom is not None and math.isfinite(f.seconds_to_oom):
                out[f"{head}/worst_seconds_to_oom"] = float(f.seconds_to_oom)
            out[f"{head}/worst_forecast"] = f"{f.metric}: {f.message}"
        for metric, v in sorted(self._peaks.items()):
            out[f"{head}/peak/{metric}_gib"] = v / GIB
        return out

    def _alert(self, run: Any, findings: Sequence[Finding]) -> None:
        if not self.alerts or bool(getattr(run, "offline", True)):
            return  # an offline run has nobody to notify
        for f in findings:
            key = (f.kind, f.metric)
            if f.severity != "critical" or key in self._alerted:
                continue
            self._alerted.add(key)
            text = warning_text(f)  # the console warning's text: verdict, holder, each fix
            where = f" [rank {self._rank}]" if self._world > 1 else ""
            title = f"memwatch{where}: {f.kind} in {f.metric}"[:63]
            run.alert(title=title, text=text, level="ERROR")
            self.alerts_sent.append(title)


def _counts(f: Finding) -> bool:
    """Does the (current) finding count for the run's verdict: a threat to the run, or a leak
    of any severity (a confirmed leak that will not kill this run is still not "ok")."""
    return (f.severity != "info" or f.kind in NOTICE_KINDS) and state_of(f) in (f.kind, "leak")


def _rank(f: Finding) -> int:
    return _SEVERITY_RANK[f.severity]


def _verdict(f: Finding) -> str:
    """``"warning: leak in device.allocated"``; a leak that is no threat says so:
    ``"info: leak in host.rss, not a threat to this run"``."""
    where = "" if f.stage == "train" else f" ({f.stage} loop)"
    text = f"{f.severity}: {f.kind} in {f.metric}{where}"
    return text + ", not a threat to this run" if f.severity == "info" else text


def _raised(peaks: Mapping[str, float], latest: Any) -> dict[str, float]:
    """Peaks seen by the sink, raised by the bundle's last sample (``manifest["latest"]``)."""
    out = dict(peaks)
    for k, v in (latest.items() if isinstance(latest, Mapping) else ()):
        if isinstance(v, (int, float)) and math.isfinite(v) and not is_count(k):
            out[k] = max(float(v), out.get(k, -math.inf))
    return out


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
