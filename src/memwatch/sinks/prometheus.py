"""Prometheus exporter: memwatch's latest sample and findings as gauges and counters.

``PrometheusSink`` serves its own registry over HTTP (``/metrics``), bound to ``127.0.0.1`` by
default: memory figures and finding messages are not for the whole network unless you say so
(``addr="0.0.0.0"``). Each rank serves on ``port + LOCAL_RANK`` so ranks on one host never fight
over a port; ``port=0`` takes a free port (read it back from ``sink.port``).

=========================================================  =====================================
series                                                     meaning
=========================================================  =====================================
``memwatch_bytes{metric, rank}``                           latest value of a byte metric
``memwatch_count{metric, rank}``                           latest value of a count metric
``memwatch_step{rank}``                                    optimizer step of that sample
``memwatch_epoch{rank}``                                   epochs closed so far
``memwatch_findings_total{kind, severity, rank}``          findings so far, every loop (counter)
``memwatch_steps_to_oom{metric, rank}``                    latest forecast per leaking metric
``memwatch_bundles_total{trigger, classification, rank}``  bundles written (counter)
=========================================================  =====================================

Metric names (``host.rss``...) are the timeline's; values are bytes (Prometheus' convention:
base units, no ``_gib``). NaN readings are skipped (the gauge keeps its previous value). Label
values pass through the same redaction as everything else memwatch lets out.

The HTTP server (:class:`memwatch.sinks.prometheus_server.MetricsServer`) gives every client 5
seconds in all and keeps at most 64 connections: an idle or slow client never stops a scrape,
and ``close()`` returns within a second whatever the clients do.

Example::

    >>> import urllib.request, memwatch
    >>> from memwatch.sinks.prometheus import PrometheusSink
    >>> sink = PrometheusSink(port=0)
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp), sinks=[sink],
    ...                     log_every_n_steps=1) as mw:
    ...     mw.step()
    ...     with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics") as r:
    ...         text = r.read().decode()
    >>> 'memwatch_bytes{metric="host.rss",rank="0"}' in text
    True
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.core.metrics import is_count
from memwatch.core.optional import require
from memwatch.core.protocols import CheckReport
from memwatch.core.redact import redact_text
from memwatch.sinks.prometheus_server import MetricsServer

__all__ = ["PrometheusSink"]

prometheus_client = require("prometheus_client", extra="prometheus", who=__name__)


class PrometheusSink:
    """Gauges per metric and rank, findings counters, on an HTTP exporter.

    Args:
        port: base port; the exporter listens on ``port + LOCAL_RANK`` (``0``: any free port).
        addr: address to bind; loopback by default.
        rank: this process's rank label; default ``RANK`` from the environment.
        registry: a ``prometheus_client.CollectorRegistry`` to register into; default a fresh
            one (several sinks in one process never collide).
        serve: start the HTTP exporter (``False``: only fill ``registry``, for an exporter you
            already run).
    """

    def __init__(self, port: int = 9464, addr: str = "127.0.0.1", rank: int | None = None,
                 registry: Any = None, serve: bool = True) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ConfigError(f"port={port!r} must be an int in 0..65535 (0 picks a free port).")
        self.rank = str(int(os.environ.get("RANK", "0") or 0) if rank is None else int(rank))
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        reg = self.registry
        self.bytes = prometheus_client.Gauge(
            "memwatch_bytes", "Latest value of a memwatch byte metric", ["metric", "rank"],
            registry=reg)
        self.count = prometheus_client.Gauge(
            "memwatch_count", "Latest value of a memwatch count metric", ["metric", "rank"],
            registry=reg)
        self.step = prometheus_client.Gauge(
            "memwatch_step", "Optimizer step of the latest sample", ["rank"], registry=reg)
        self.epoch = prometheus_client.Gauge(
            "memwatch_epoch", "Epochs closed so far", ["rank"], registry=reg)
        self.findings = prometheus_client.Counter(
            "memwatch_findings", "memwatch findings so far", ["kind", "severity", "rank"],
            registry=reg)
        self.steps_to_oom = prometheus_client.Gauge(
            "memwatch_steps_to_oom", "Latest out-of-memory forecast (steps) per leaking metric",
            ["metric", "rank"], registry=reg)
        self.bundles = prometheus_client.Counter(
            "memwatch_bundles", "Flight-recorder bundles written",
            ["trigger", "classification", "rank"], registry=reg)
        self.addr = addr
        self.port: int | None = None
        self._server: MetricsServer | None = None
        if serve:
            self._serve(port + int(os.environ.get("LOCAL_RANK", "0") or 0) if port else 0)

    def _render(self) -> tuple[bytes, str]:
        return (prometheus_client.generate_latest(self.registry),
                str(prometheus_client.CONTENT_TYPE_LATEST))

    def _serve(self, port: int) -> None:
        try:
            self._server = MetricsServer(self.addr, port, self._render)
        except OSError as e:
            raise ConfigError(
                f"PrometheusSink could not listen on {self.addr}:{port} ({e}); pass another "
                "port=..., or port=0 for any free port."
            ) from e
        self.port = self._server.port

    # ------------------------------------------------------------------ sink protocol
    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        for metric, value in sample.items():
            if value is None or math.isnan(value):
                continue
            g = self.count if is_count(metric) else self.bytes
            g.labels(metric=_label(metric), rank=self.rank).set(float(value))
        self.step.labels(rank=self.rank).set(step)

    def on_check(self, report: CheckReport) -> None:
        if report.stage == "train" and report.at == "epoch_end":
            self.epoch.labels(rank=self.rank).set(report.epoch + 1)
        for f in report.findings:
            self.findings.labels(kind=_label(f.kind), severity=_label(f.severity),
                                 rank=self.rank).inc()
            if f.steps_to_oom is not None and math.isfinite(f.steps_to_oom):
                self.steps_to_oom.labels(metric=_label(f.metric), rank=self.rank).set(
                    f.steps_to_oom)

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self.bundles.labels(trigger=_label(manifest.get("trigger")),
                            classification=_label(manifest.get("classification")),
                            rank=self.rank).inc()

    def close(self) -> None:
        """Stop the exporter (within a second, whatever its clients do)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()


def _label(value: Any) -> str:
    """A label value as it may leave the process: redacted, and of bounded length."""
    return _clean_label(str(value))


@functools.lru_cache(maxsize=1024)  # metric names are few: redacted once each
def _clean_label(value: str) -> str:
    return redact_text(value)[:200]
