"""Weights & Biases: memwatch's charts, findings, leak forecasts and bundles in the user's run.

:class:`WandbSink` writes into the run the user already has and never creates one. It finds it,
in this order: the ``run=`` it was given (a ``wandb`` run, a Lightning ``WandbLogger``, the
transformers ``WandbCallback``, an Accelerate wandb tracker), else ``wandb.run``. It imports
nothing: when wandb was never imported by the program there can be no run, and the sink does
nothing. A rank without a run (DDP ranks > 0 under Lightning) does nothing either; a rank with
its own run logs its own memory under the same keys (the run is that rank's).

It is the one writer of memwatch's keys into W&B, whatever the loop or launcher: the framework
adapters leave W&B to it (their own logging paths still feed the other loggers). Its data joins
the framework's current history row (``commit=False``): it never adds rows of its own, and its
series are drawn against ``memwatch/step`` (the optimizer step) through ``define_metric``.

What lands in the run (every key, and what each panel shows: ``docs/wandb.md``):

* per-sample series under ``memwatch/`` (one section of panels), with ``max`` summaries for
  memory levels;
* at every check (:meth:`WandbSink.on_check`: epoch ends, checks inside epochs, the last word,
  training and evaluation loops) ``memwatch/findings/...`` counts and rates, an evaluation
  loop's figures under ``memwatch/<stage>/``, rank 0's figures of every rank, a
  ``memwatch/leak/<metric>`` chart per leaking metric (check floors, fitted trend, forecast to
  the limit), ``run.summary`` fields (the verdict, the number of current verdicts, peaks, worst
  forecast, the verdicts later checks withdrew), one ``memwatch/findings_table`` in the summary
  (one row per belief: its current state and history, written again only when a verdict
  changes) and, when the run is online, one ``run.alert`` per
  warning or critical finding;
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
    check_metrics,
    finding_row,
    is_count,
    to_log_metrics,
)
from memwatch.core.protocols import CheckReport
from memwatch.core.units import fmt_bytes
from memwatch.core.verdict_words import counts, run_verdict, worst_first
from memwatch.runtime.warn import warning_text
from memwatch.sinks.wandb_panels import leak_chart, summary_fields

__all__ = ["WandbSink", "find_run"]

log = logging.getLogger("memwatch")

_OOM_CLASSES = ("cuda_oom", "host_oom", "mps_oom")
_FINAL_CHOICES = ("findings", "always", "never")
_MAX_TABLE_ROWS = 500
_MAX_CHECKS = 64  # floors kept per metric for the leak charts
_ALERT_LEVELS = {"warning": "WARN", "critical": "ERROR"}
_TABLE = f"{PREFIX}/findings_table"


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
        stage: ``"train"`` (keys ``memwatch/...``) or ``"val"``/``"test"`` (``memwatch/val/...``):
            the loop whose samples it gets.
        commit: ``False`` (default): memwatch's data joins the framework's current history row
            and never moves the run's step (no rows of its own). ``True``: each memwatch sample is
            a row of its own (what it did before).
        series: log the per-step series, the evaluation loops' figures and the findings counts.
            ``False`` when something else writes memwatch's keys into this run; the sink then
            adds only the leak charts, summary, findings table, alerts, artifacts and report.
        charts: log a leak chart per leaking metric at checks.
        alerts: ``True``: ``run.alert`` once per warning or critical finding (kind, metric and
            severity) when the run is online; ``"always"``: offline runs too (W&B sends them
            when the run is synced); ``False``: none.
        artifacts: upload bundles as artifacts.
        final_snapshot: when the session closes without an uploaded bundle, ask it for one
            end-of-run bundle (HTML report, snapshot): ``"findings"`` (after a warning or
            critical finding, or a confirmed leak of any severity; default), ``"always"`` or
            ``"never"``.
    """

    def __init__(self, run: Any = None, *, stage: str = "train", commit: bool = False,
                 series: bool = True, charts: bool = True, alerts: bool | str = True,
                 artifacts: bool = True, final_snapshot: str = "findings") -> None:
        if stage not in ("train", "val", "test", "predict"):
            raise ConfigError(f"stage={stage!r}: use 'train', 'val', 'test' or 'predict'.")
        if final_snapshot not in _FINAL_CHOICES:
            raise ConfigError(f"final_snapshot={final_snapshot!r}: use one of {_FINAL_CHOICES}.")
        if alerts not in (True, False, "always"):
            raise ConfigError(f"alerts={alerts!r}: use True (online runs), 'always' or False.")
        self.source = run
        self.stage = stage
        self.commit = bool(commit)
        self.series = bool(series)
        self.charts = bool(charts)
        self.alerts = alerts
        self.artifacts = bool(artifacts)
        self.final_snapshot = final_snapshot
        self.run: Any = None
        self.found_via = ""
        self.closed = False
        #: Names of the artifacts logged (``name:type``), for the user and the tests.
        self.logged_artifacts: list[str] = []
        self.alerts_sent: list[str] = []
        self._rank = 0
        self._world = 1
        self._defined: set[str] = set()
        self._peaks: dict[str, float] = {}
        #: (stage, metric) -> (end step, floor) of the checks the sink was given.
        self._floors: dict[tuple[str, str], collections.deque[tuple[int, float]]] = {}
        #: stage -> its session's current verdicts (the latest report's, or, for reports made
        #: elsewhere, the latest finding of each belief).
        self._current: dict[str, dict[str, Finding]] = {}
        self._current_of: dict[str, tuple[Finding, ...]] = {}
        #: belief -> the changes of its state (``state``, ``check``, ``step``...), oldest first.
        self._changes: dict[str, list[dict[str, Any]]] = {}
        self._n_findings = 0
        self._alerted: set[tuple[str, str, str]] = set()
        self._table_rows: list[list[Any]] | None = None  # the rows of the table last written
        #: A check's figures and charts, waiting to join the next sample's row (a check at an
        #: epoch end or at the close comes after the framework's row of that step: logged
        #: alone, it would end up in a row of its own).
        self._waiting: dict[str, Any] = {}
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
        return run

    def _step_key(self, stage: str) -> str:
        return f"{self._head(stage)}/step"

    def _commit(self) -> bool:
        return self.commit

    def _define(self, run: Any, keys: Sequence[str], step_key: str) -> None:
        if step_key not in self._defined:
            self._defined.add(step_key)
            run.define_metric(step_key, hidden=True)
        for k in keys:
            if k in self._defined:
                continue
            self._defined.add(k)
            if k.endswith(("_gib", "_mib_per_step")):
                # a memory level's summary is its peak
                run.define_metric(k, step_metric=step_key, summary="max")
            elif k.endswith(("steps_to_oom", "_seconds_to_oom_s")):
                run.define_metric(k, step_metric=step_key, summary="min")  # the most urgent
            else:  # counts: the summary is the last value, a plain number
                run.define_metric(k, step_metric=step_key)

    def _log(self, run: Any, data: dict[str, Any], step: int, stage: str | None = None) -> None:
        key = self._step_key(stage or self.stage)
        data[key] = step
        self._define(run, [k for k, v in data.items() if isinstance(v, (int, float))], key)
        if self._waiting:  # a check's figures ride on this row (the sample's step wins)
            data = {**self._waiting, **data}
            self._waiting = {}
        run.log(data, commit=self._commit())

    def _later(self, run: Any, data: dict[str, Any], step: int, stage: str) -> None:
        """A check's row: with the next sample (see :attr:`_waiting`); now when no sample comes
        (``series=False``, ``commit=True``), or where the framework logs with explicit steps
        (Accelerate's trackers: the row of its last step is still open, and takes it)."""
        if not self.series or self.commit or self.found_via == "accelerate":
            self._log(run, data, step, stage)
            return
        key = self._step_key(stage)
        data[key] = step
        self._define(run, [k for k, v in data.items() if isinstance(v, (int, float))], key)
        self._waiting.update(data)

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
        self._log(run, to_log_metrics(sample, stage=self.stage), step)

    def on_check(self, report: CheckReport) -> None:
        """A check of any loop: its findings join the verdict, the table and the alerts; its
        figures (counts, an evaluation loop's levels, rank 0's figures of every rank) and leak
        charts are logged under that loop's keys, on the framework's current row."""
        self._remember(report)
        self._n_findings += len(report.findings)
        mine = self._current.setdefault(report.stage, {})
        for f in report.findings:
            key = _belief(f)
            mine.pop(key, None)
            mine[key] = f
            changes = self._changes.setdefault(key, [])
            changes += [c for c in history([f], key)
                        if not changes or c["state"] != changes[-1]["state"]]
        if report.current:
            self._current_of[report.stage] = tuple(report.current)
        run = self._get_run()
        if run is None:
            return
        wandb = sys.modules["wandb"]
        data: dict[str, Any] = {}
        if self.series:
            data.update(check_metrics(report))
        if self.charts:
            for f in report.findings:
                if f.kind == "leak" and f.bytes_per_step:
                    chart = leak_chart(wandb, f, list(self._floors.get((f.stage, f.metric), ())),
                                       self._peaks)
                    if chart is not None:
                        data[f"{self._head(f.stage)}/leak/{f.metric}"] = chart
        if data:
            self._later(run, data, int(report.step), report.stage)
        self._write_table(run, wandb, final=False)
        run.summary.update(self._summary_fields())
        self._alert(run, report.findings)

    def current(self) -> list[Finding]:
        """The current verdicts of every loop this sink heard of: one per belief (the latest
        report's, or, for reports made elsewhere, the latest finding of each belief)."""
        out: list[Finding] = []
        for stage in sorted({*self._current_of, *self._current}):
            got = self._current_of.get(stage)
            out += list(got) if got is not None else list(self._current.get(stage, {}).values())
        return out

    def _write_table(self, run: Any, wandb: Any, final: bool) -> None:
        """The findings table, one row per belief (its current state, with its history), in the
        run's summary: written again when a verdict changes (kind, state, severity or holder; at
        the close, any of its figures), not at every check: each write is a new version of the
        table's artifact."""
        rows = [finding_row(f, f.stage, self._history(_belief(f)))
                for f in self.current()][-_MAX_TABLE_ROWS:]
        if not rows or not self.series and not self.charts:
            return
        last = self._table_rows
        if last is not None and (rows == last or not final and _beliefs(rows) == _beliefs(last)):
            return
        self._table_rows = rows
        run.summary[_TABLE] = wandb.Table(columns=list(FINDING_COLUMNS),
                                          data=[list(r) for r in rows])

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
            self._later(run, data, int(doc.get("step") or 0), self.stage)
        run.summary.update({f"{head}/bundle": f"{name} ({kind})",
                            f"{head}/bundle_trigger": str(doc.get("trigger"))})

    @property
    def wants_final_bundle(self) -> bool:
        """Whether the closing session should write an end-of-run bundle for this sink."""
        if self._uploaded or not self.artifacts or self.final_snapshot == "never":
            return False
        if self._get_run() is None:
            return False
        return self.final_snapshot == "always" or any(counts(f) for f in self.current())

    def close(self) -> None:
        # The run is the user's: it is not finished here, only no longer written to.
        self.closed = True
        run = self.run
        if run is not None and not _finished(run):
            self._write_table(run, sys.modules["wandb"], final=True)
            # What no sample took along (the last checks' figures, a bundle's report) goes to
            # the summary: a row of memwatch's own at the end would be the one W&B commits
            # alone. (A chart cannot be a summary value: the latest drawn stays in the history.)
            waiting, self._waiting = self._waiting, {}
            run.summary.update({k: v for k, v in waiting.items() if not k.endswith("/step") and
                                (isinstance(v, (int, float)) or type(v).__name__ == "Html")})
            run.summary.update(self._summary_fields())

    # ------------------------------------------------------------------ content
    def _head(self, stage: str | None = None) -> str:
        stage = stage or self.stage
        return PREFIX if stage == "train" else f"{PREFIX}/{stage}"

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

    def _history(self, key: str) -> str | None:
        changes = self._changes.get(key) or []
        return describe(changes) if len(changes) > 1 else None

    def _summary_fields(self) -> dict[str, Any]:
        current = self.current()
        out = summary_fields(self._head(), current, run_verdict(current), worst_first(current),
                             self._n_findings, self._peaks)
        # A leak verdict a later check withdrew (growth that stopped, a container that turned
        # out bounded) no longer counts for the verdict: it is listed, with its history.
        gone = [f"{f.metric}: {self._history(_belief(f))}" for f in current
                if state_of(f) != "leak"
                and any(c["state"] == "leak" for c in self._changes.get(_belief(f), []))]
        if gone:
            out[f"{self._head()}/verdicts_withdrawn"] = gone[-8:]
        return out

    def _alert(self, run: Any, findings: Sequence[Finding]) -> None:
        if not self.alerts or (self.alerts is True and bool(getattr(run, "offline", True))):
            return  # an offline run has nobody to notify (unless alerts="always")
        for f in findings:
            level = _ALERT_LEVELS.get(f.severity)
            key = (f.kind, f.metric, f.severity)
            if level is None or key in self._alerted:
                continue
            self._alerted.add(key)
            text = warning_text(f)  # the console warning's text: verdict, holder, each fix
            where = f" [rank {self._rank}]" if self._world > 1 else ""
            title = f"memwatch{where}: {f.kind} in {f.metric} ({f.severity})"[:63]
            run.alert(title=title, text=text, level=level)
            self.alerts_sent.append(title)


def _belief(f: Finding) -> str:
    """The belief ``f`` states (one per loop, kind and metric for a finding without one)."""
    return f.belief or f"{f.stage}/{f.metric}/{f.kind}"


def _beliefs(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    """What a table row says, without its figures: stage, kind, metric, severity, holder,
    state."""
    i = {c: n for n, c in enumerate(FINDING_COLUMNS)}
    return [(r[i["stage"]], r[i["kind"]], r[i["metric"]], r[i["severity"]],
             str(r[i["culprit"]] or "").split(" (")[0], r[i["state"]]) for r in rows]


def _raised(peaks: Mapping[str, float], latest: Any) -> dict[str, float]:
    """Peaks seen by the sink, raised by the bundle's last sample (``manifest["latest"]``)."""
    out = dict(peaks)
    for k, v in (latest.items() if isinstance(latest, Mapping) else ()):
        if isinstance(v, (int, float)) and math.isfinite(v) and not is_count(k):
            out[k] = max(float(v), out.get(k, -math.inf))
    return out


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
