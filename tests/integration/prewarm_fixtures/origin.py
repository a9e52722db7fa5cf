"""A real HTTP origin for prewarm tests: Range, ETag/If-Range, redirects and injected faults.

It is a real server on a real socket (http.server), serving files from a directory with
sendfile. Faults are armed per path: drop the connection after N body bytes, throttle, or answer
chunked without a length. Every request's path and headers are recorded for assertions.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]


@dataclass
class Faults:
    drop_after: dict[str, int] = field(default_factory=dict)  # once, then cleared
    rate_bps: dict[str, int] = field(default_factory=dict)
    chunked: set[str] = field(default_factory=set)
    redirects: dict[str, str] = field(default_factory=dict)
    # Serve a Range whatever If-Range says, as S3 does: a changed object then answers 206
    ignore_if_range: set[str] = field(default_factory=set)
    # A 416's body: this many bytes, unframed (read to the close), after the headers
    unsatisfied_body: dict[str, int] = field(default_factory=dict)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # A client that goes away mid-body (a cancelled or stopped fetch) is what these tests
        # do on purpose; anything else is printed as usual.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class Origin:
    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.faults = Faults()
        self.requests: list[Recorded] = []
        # path -> bytes of an armed 416 body the client took before it closed (set once done)
        self.unsatisfied_sent: dict[str, int] = {}
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                origin._serve(self)

        self.server = _QuietServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Origin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def add(self, name: str, data: bytes) -> str:
        (self.root / name).write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    def ranges(self, path: str) -> list[str | None]:
        """The Range header of every request for ``path``, in order."""
        return [r.headers.get("Range") for r in self.requests if r.path == "/" + path]

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append(Recorded(h.path, {k: v for k, v in h.headers.items()}))
        if path in self.faults.redirects:
            h.send_response(302)
            h.send_header("Location", self.faults.redirects[path])
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        file = self.root / path.lstrip("/")
        if ".." in path or not file.is_file():
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        size = file.stat().st_size
        etag = f'"{int(file.stat().st_mtime_ns)}-{size}"'
        start, end, status = 0, size - 1, 200
        match = _RANGE.fullmatch(h.headers.get("Range", ""))
        if_range = h.headers.get("If-Range")
        honour = path not in self.faults.ignore_if_range
        if match and (if_range is None or if_range == etag or not honour):
            start = int(match[1])
            end = int(match[2]) if match[2] else size - 1
            if start >= size:
                self._unsatisfied(h, path, size)
                return
            status = 206
        h.send_response(status)
        h.send_header("ETag", etag)
        h.send_header("Accept-Ranges", "bytes")
        chunked = path in self.faults.chunked
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        drop = self.faults.drop_after.pop(path, None)
        rate = self.faults.rate_bps.get(path)
        with file.open("rb") as f:
            if chunked:
                self._chunked(h, f, start, end)
            elif drop is None and rate is None:
                h.wfile.flush()
                h.connection.sendfile(f, start, end - start + 1)
            else:
                self._slow(h, f, start, end, drop, rate)
        if drop is not None:
            h.close_connection = True

    def _unsatisfied(self, h: BaseHTTPRequestHandler, path: str, size: int) -> None:
        h.send_response(416)
        h.send_header("Content-Range", f"bytes */{size}")
        body = self.faults.unsatisfied_body.get(path)
        if body is None:
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_header("Connection", "close")  # no length: the body ends at the close
        h.end_headers()
        h.close_connection = True
        chunk, sent = b"x" * 65536, 0
        with contextlib.suppress(OSError):  # the client closed without reading it all
            while sent < body:
                h.wfile.write(chunk[: body - sent])
                sent += min(len(chunk), body - sent)
            h.wfile.flush()
        self.unsatisfied_sent[path] = sent

    def _chunked(self, h: BaseHTTPRequestHandler, f: object, start: int, end: int) -> None:
        fd = f.fileno()  # type: ignore[attr-defined]
        pos = start
        while pos <= end:
            data = os.pread(fd, min(65536, end - pos + 1), pos)
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            pos += len(data)
        h.wfile.write(b"0\r\n\r\n")

    def _slow(
        self,
        h: BaseHTTPRequestHandler,
        f: object,
        start: int,
        end: int,
        drop: int | None,
        rate: int | None,
    ) -> None:
        fd = f.fileno()  # type: ignore[attr-defined]
        pos, sent = start, 0
        # Paced against a schedule, not by a sleep per chunk: a sleep's own cost (tens of us)
        # would cap a fast rate far below what was asked.
        step = 65536 if not rate or rate < 64 * 1024 * 1024 else 1024 * 1024
        began = time.monotonic()
        while pos <= end:
            n = min(step, end - pos + 1)
            if drop is not None:
                n = min(n, drop - sent)
                if n <= 0:
                    h.wfile.flush()
                    h.connection.shutdown(2)
                    return
            h.wfile.write(os.pread(fd, n, pos))
            pos, sent = pos + n, sent + n
            if rate:
                ahead = sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
        h.wfile.flush()
