"""The Prometheus exporter with hostile or careless clients on real sockets: an idle
connection, 200 of them, a client that trickles its request, one that never reads its answer,
oversized or wrong requests. Scrapes keep working and ``close()`` returns within a second."""

from __future__ import annotations

import doctest
import http.client
import socket
import threading
import time
import urllib.request

import pytest

from memwatch.core.findings import Finding
from memwatch.core.protocols import CheckReport

pytest.importorskip("prometheus_client")
from memwatch.sinks import prometheus_server  # noqa: E402
from memwatch.sinks.prometheus import PrometheusSink  # noqa: E402


@pytest.fixture
def sink() -> PrometheusSink:
    s = PrometheusSink(port=0)
    s.on_metrics(1, {"host.rss": 1.0})
    yield s  # type: ignore[misc]
    s.close()


def scrape_ok(port: int, timeout: float = 3.0) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.status == 200 and b"memwatch_bytes" in r.read()


def closes_fast(s: PrometheusSink) -> float:
    t0 = time.monotonic()
    s.close()
    return time.monotonic() - t0


def test_idle_connections_never_stop_a_scrape_nor_close(sink: PrometheusSink) -> None:
    assert sink.port is not None
    idle = [socket.create_connection(("127.0.0.1", sink.port)) for _ in range(200)]
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        assert scrape_ok(sink.port)
        assert time.monotonic() - t0 < 2.0
        assert closes_fast(sink) < 1.0
    finally:
        for c in idle:
            c.close()


def test_a_trickling_client_is_dropped_when_its_time_is_up(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    srv = prometheus_server.MetricsServer("127.0.0.1", 0, lambda: (b"up 1\n", "text/plain"),
                                          timeout_s=0.5)
    c = socket.create_connection(("127.0.0.1", srv.port))
    stop = threading.Event()

    def trickle() -> None:
        for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            if stop.is_set():
                return
            try:
                c.send(bytes([ch]))
            except OSError:
                return
            time.sleep(0.02)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=3) as r:
            assert r.read() == b"up 1\n"  # served while the other trickles
        deadline = time.monotonic() + 5
        while srv.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.connections == 0  # the trickler ran out of time and was dropped
        c.settimeout(2)
        assert c.recv(100) == b""  # closed by the server
    finally:
        stop.set()
        c.close()
        t0 = time.monotonic()
        srv.close()
        assert time.monotonic() - t0 < 1.0


def test_a_client_that_never_reads_its_answer_does_not_block_others() -> None:
    big = b"x" * (8 << 20)  # larger than the socket buffers: the send cannot finish
    srv = prometheus_server.MetricsServer("127.0.0.1", 0, lambda: (big, "text/plain"),
                                          timeout_s=1.0)
    c = socket.create_connection(("127.0.0.1", srv.port))
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
    try:
        time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/metrics")
        assert len(conn.getresponse().read()) == len(big)
        conn.close()
    finally:
        c.close()
        t0 = time.monotonic()
        srv.close()
        assert time.monotonic() - t0 < 1.0


def request(port: int, method: str, path: str, **kw: object) -> tuple[int, bytes, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, **kw)  # type: ignore[arg-type]
        r = conn.getresponse()
        return r.status, r.read(), int(r.getheader("Content-Length") or -1)
    finally:
        conn.close()


def test_wrong_and_oversized_requests(sink: PrometheusSink) -> None:
    assert sink.port is not None
    assert request(sink.port, "GET", "/other")[0] == 404
    assert request(sink.port, "POST", "/metrics", body=b"x")[0] == 405
    assert request(sink.port, "GET", "/metrics", headers={"X-Big": "a" * 10_000})[0] == 431
    status, body, length = request(sink.port, "HEAD", "/metrics")
    assert status == 200 and body == b"" and length > 0
    assert scrape_ok(sink.port)


def test_more_connections_than_allowed_evict_the_oldest() -> None:
    srv = prometheus_server.MetricsServer("127.0.0.1", 0, lambda: (b"up 1\n", "text/plain"),
                                          max_connections=8)
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
    try:
        time.sleep(0.3)
        assert srv.connections <= 8
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/", timeout=3) as r:
            assert r.read() == b"up 1\n"
    finally:
        for c in idle:
            c.close()
        srv.close()


def test_label_values_are_redacted(sink: PrometheusSink) -> None:
    assert sink.port is not None
    f = Finding(kind="leak", metric="host.rss hf_Zq1Zq2Zq3Zq4Zq5Zq6Zq7", severity="warning",
                message="m", steps_to_oom=10.0)
    sink.on_check(CheckReport(stage="train", epoch=0, step=1, check=0, at="epoch_end",
                              findings=[f]))
    with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=3) as r:
        text = r.read().decode()
    assert "Zq1Zq2" not in text and "<redacted>" in text


def test_server_docstring_example() -> None:
    res = doctest.testmod(prometheus_server, extraglobs={}, verbose=False)
    assert res.attempted >= 1 and res.failed == 0
