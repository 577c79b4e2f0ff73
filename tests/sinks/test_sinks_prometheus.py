"""PrometheusSink, scraped over HTTP on loopback like a Prometheus server would."""

from __future__ import annotations

import doctest
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from memwatch.core.errors import ConfigError
from sinks_helpers import GIB, leak_run

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from memwatch.sinks.prometheus import PrometheusSink  # noqa: E402


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_each_local_rank_serves_on_its_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a free base port (its neighbour is checked by the bind)
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1] - 1
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    sink = PrometheusSink(port=base)
    try:
        assert sink.port == base + 1 and sink.rank == "3"
        sink.on_metrics(1, {"host.rss": 1.0})
        assert scrape(sink.port)[("memwatch_bytes", (("metric", "host.rss"), ("rank", "3")))] == 1
    finally:
        sink.close()


def test_scrape_while_running(tmp_path: Path) -> None:
    sink = PrometheusSink(port=0, rank=0)

    class Scraper:
        """A sink that scrapes the exporter at every epoch end (while the session runs)."""

        seen: list[dict] = []

        def on_metrics(self, step: int, sample: object) -> None: ...
        def on_findings(self, epoch: int, findings: object, summary: object) -> None:
            self.seen.append(scrape(sink.port))  # type: ignore[arg-type]
        def on_bundle(self, path: object, manifest: object) -> None:
            self.seen.append(scrape(sink.port))  # type: ignore[arg-type]
        def close(self) -> None: ...

    scraper = Scraper()
    leak_run(tmp_path, [sink, scraper], epochs=3, steps=100, every=25, oom=True)
    last_epoch, after_oom = scraper.seen[2], scraper.seen[3]
    alloc = last_epoch[("memwatch_bytes", (("metric", "device.allocated"), ("rank", "0")))]
    assert alloc == pytest.approx(GIB + 299 * 2 * 2**20, abs=1e6)
    assert last_epoch[("memwatch_step", (("rank", "0"),))] == 300
    assert last_epoch[("memwatch_count", (("metric", "device.ooms"), ("rank", "0")))] == 0
    assert last_epoch[("memwatch_epoch", (("rank", "0"),))] == 3
    leaks = last_epoch[("memwatch_findings_total",
                        (("kind", "leak"), ("rank", "0"), ("severity", "warning")))]
    assert leaks == 2  # a verdict at the second and third epoch ends
    oom_steps = last_epoch[("memwatch_steps_to_oom",
                            (("metric", "device.allocated"), ("rank", "0")))]
    assert oom_steps > 0
    bundles = after_oom[("memwatch_bundles_total", (("classification", "cuda_oom"),
                                                    ("rank", "0"), ("trigger", "exception")))]
    assert bundles == 1
    with pytest.raises(urllib.error.URLError):  # closed with the session
        scrape(sink.port)  # type: ignore[arg-type]


def test_port_in_use_is_a_config_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="port=0"):
            PrometheusSink(port=port)
    with pytest.raises(ConfigError, match="port"):
        PrometheusSink(port=70000)


def test_no_server_fills_a_given_registry() -> None:
    reg = prometheus_client.CollectorRegistry()
    sink = PrometheusSink(serve=False, registry=reg, rank=2)
    sink.on_metrics(7, {"host.rss": 5.0 * GIB, "workers.count": 2.0, "host.uss": float("nan")})
    assert sink.port is None
    assert reg.get_sample_value("memwatch_bytes", {"metric": "host.rss", "rank": "2"}) == 5 * GIB
    assert reg.get_sample_value("memwatch_count", {"metric": "workers.count", "rank": "2"}) == 2
    assert reg.get_sample_value("memwatch_bytes", {"metric": "host.uss", "rank": "2"}) is None
    sink.close()


def test_docstring_example(tmp_path: Path) -> None:
    import memwatch.sinks.prometheus as mod

    res = doctest.testmod(mod, extraglobs={"tmp": str(tmp_path)})
    assert res.attempted > 0 and res.failed == 0
