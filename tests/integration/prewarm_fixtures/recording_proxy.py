"""A forward HTTP proxy that records every request it relays, for tinyproxy's ``Upstream``.

Chained behind tinyproxy (the stand-in for dfdaemon's proxy), it sees the request exactly as the
"Dragonfly" side would send it on: the absolute URL, the X-Dragonfly-* headers, tinyproxy's Via.
A fault can corrupt the body of a path, as a bad cache or peer would.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urljoin, urlsplit


@dataclass
class Relayed:
    method: str
    url: str
    headers: dict[str, str]
    status: int = 0
    body_bytes: int = 0


@dataclass
class RecordingProxy:
    requests: list[Relayed] = field(default_factory=list)
    corrupt: set[str] = field(default_factory=set)  # URL paths whose bodies get one byte flipped
    follow_redirects: bool = False  # follow the origin's redirects itself, as dfdaemon does
    port: int = 0

    def __post_init__(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                proxy._relay(self)

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _relay(self, h: BaseHTTPRequestHandler) -> None:
        record = Relayed(h.command, h.path, {k: v for k, v in h.headers.items()})
        self.requests.append(record)
        url = urlsplit(h.path)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("proxy-connection",)}
        for _ in range(10):
            conn = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=30)
            target = url.path + (f"?{url.query}" if url.query else "")
            headers["Host"] = url.netloc
            conn.request(h.command, target, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            location = resp.getheader("Location")
            if not (
                self.follow_redirects and resp.status in (301, 302, 303, 307, 308) and location
            ):
                break
            url = urlsplit(urljoin(url.geturl(), location))
        if url.path in self.corrupt and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        record.status, record.body_bytes = resp.status, len(body)
        h.send_response(resp.status, resp.reason)
        for key, value in resp.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
