"""The exporter's HTTP server: ``GET /metrics`` on one thread, with bounds on every client.

``wsgiref``'s server handles one connection at a time and waits for its request without a
limit: one idle TCP connection stopped every scrape, and ``close()`` waited for it forever. This
server multiplexes its connections on one thread (a selector, non-blocking sockets):

* each connection has ``timeout_s`` in all (from accept to the last byte sent): an idle or
  trickling client is dropped when it runs out, whatever the others do;
* at most ``max_connections`` are open; a new one beyond that evicts the oldest;
* a request is at most 8 KiB of headers; only ``GET``/``HEAD`` of ``/metrics`` (or ``/``) are
  served (404 and 405 otherwise), with ``Connection: close``;
* :meth:`MetricsServer.close` returns within a second: the thread polls a stop flag every 50 ms
  and every socket is closed on its way out.

Example::

    >>> import urllib.request
    >>> from memwatch.sinks.prometheus_server import MetricsServer
    >>> srv = MetricsServer("127.0.0.1", 0, lambda: (b"up 1\\n", "text/plain"))
    >>> with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=5) as r:
    ...     r.read()
    b'up 1\\n'
    >>> srv.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["MetricsServer"]

log = logging.getLogger("memwatch")

#: What a render function returns: the body and its content type.
Render = Callable[[], tuple[bytes, str]]
_MAX_REQUEST = 8192
_POLL_S = 0.05


@dataclasses.dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbuf: bytearray = dataclasses.field(default_factory=bytearray)
    out: memoryview | None = None


def _response(status: str, body: bytes, ctype: str, head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("ascii")
    return head if head_only else head + body


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` on ``addr:port`` (``port=0``: any free port, read it
    back from :attr:`port`) until :meth:`close`. Raises ``OSError`` when it cannot listen."""

    def __init__(self, addr: str, port: int, render: Render, timeout_s: float = 5.0,
                 max_connections: int = 64) -> None:
        self.render = render
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._listen = socket.create_server((addr, port), family=family, backlog=64)
        self._listen.setblocking(False)
        self.port = int(self._listen.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="memwatch-prometheus",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ loop
    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._sel.select(timeout=_POLL_S):
                    if key.fileobj is self._listen:
                        self._accept()
                        continue
                    c = self._conns.get(key.fd)
                    if c is None:
                        continue
                    try:
                        if events & selectors.EVENT_READ:
                            self._read(c)
                        elif events & selectors.EVENT_WRITE:
                            self._send(c)
                    except OSError:
                        self._drop(c)
                now = time.monotonic()
                for c in [c for c in self._conns.values() if c.deadline < now]:
                    self._drop(c)  # idle, trickling or not reading its answer: out of time
        except Exception:  # noqa: BLE001 - an exporter must never take the run down
            log.warning("memwatch: the Prometheus exporter stopped", exc_info=True)
        finally:
            for c in list(self._conns.values()):
                self._drop(c)
            with contextlib.suppress(Exception):
                self._sel.close()
            with contextlib.suppress(OSError):
                self._listen.close()

    def _accept(self) -> None:
        for _ in range(16):
            try:
                sock, _ = self._listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            if len(self._conns) >= self.max_connections:
                self._drop(min(self._conns.values(), key=lambda c: c.deadline))
            c = _Conn(sock, time.monotonic() + self.timeout_s)
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, None)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._drop(c)
            return
        c.inbuf += data
        end = c.inbuf.find(b"\r\n\r\n")
        if end > _MAX_REQUEST or (end < 0 and len(c.inbuf) > _MAX_REQUEST):
            self._answer(c, _response("431 Request Header Fields Too Large", b"", "text/plain"))
        elif end >= 0:
            self._answer(c, self._respond(bytes(c.inbuf[:end])))

    def _respond(self, head: bytes) -> bytes:
        line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) != 3 or not line[2].startswith("HTTP/"):
            return _response("400 Bad Request", b"bad request\n", "text/plain")
        method, target = line[0], line[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"GET /metrics\n", "text/plain")
        if target not in ("/metrics", "/"):
            return _response("404 Not Found", b"GET /metrics\n", "text/plain")
        try:
            body, ctype = self.render()
        except Exception as e:  # noqa: BLE001
            return _response("500 Internal Server Error", f"{type(e).__name__}\n".encode(),
                             "text/plain")
        return _response("200 OK", body, ctype, head_only=method == "HEAD")

    def _answer(self, c: _Conn, data: bytes) -> None:
        c.out = memoryview(data)
        self._sel.modify(c.sock, selectors.EVENT_WRITE, None)
        self._send(c)

    def _send(self, c: _Conn) -> None:
        if c.out is None:
            return
        try:
            n = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        c.out = c.out[n:]
        if not len(c.out):
            self._drop(c)

    def _drop(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            with contextlib.suppress(Exception):
                self._sel.unregister(c.sock)
        with contextlib.suppress(OSError):
            c.sock.close()

    # ------------------------------------------------------------------ lifecycle
    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    def close(self, timeout_s: float = 0.9) -> None:
        """Stop serving and close every connection; returns within ``timeout_s`` (the thread
        polls its stop flag every 50 ms; a daemon thread late on a loaded machine is left to
        finish on its own)."""
        self._stop.set()
        self._thread.join(timeout_s)
