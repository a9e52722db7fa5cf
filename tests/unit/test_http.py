"""The agent's small HTTP server: routes, status codes, slow clients that cannot block it, a
correct HTTP/1.1 request loop (bodies consumed, keep-alive, bounded heads) and gzip."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import re
import socket
import threading
import urllib.request
from typing import Any

from agent.http import HttpServer, Request, Response


async def _get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_routes_status_codes_and_errors() -> None:
    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    async def boom(_: Request) -> Response:
        raise RuntimeError("bug")

    async def main() -> None:
        server = HttpServer({"/ok": ok, "/boom": boom})
        port = await server.start("127.0.0.1", 0)
        try:
            assert await _get(port, "/ok") == (200, b"fine\n")
            assert await _get(port, "/ok?x=1") == (200, b"fine\n")
            assert (await _get(port, "/missing"))[0] == 404
            assert (await _get(port, "/ok", "POST"))[0] == 405
            assert (await _get(port, "/boom"))[0] == 500
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_stalled_client_does_not_block_others() -> None:
    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    async def main() -> None:
        server = HttpServer({"/ok": ok})
        port = await server.start("127.0.0.1", 0)
        try:
            _, stalled = await asyncio.open_connection("127.0.0.1", port)
            stalled.write(b"GET /ok HTTP/1.1\r\n")  # never finishes its headers
            await stalled.drain()
            assert await asyncio.wait_for(_get(port, "/ok"), 2) == (200, b"fine\n")
            stalled.close()
        finally:
            await server.stop()

    asyncio.run(main())


class _Served:
    """An HttpServer on a thread's event loop, for blocking clients (http.client, urllib)."""

    def __init__(self, routes: dict[str, Any], **options: Any) -> None:
        self.routes = routes
        self.options = options
        self.port = 0

    def __enter__(self) -> _Served:
        ready = threading.Event()

        def run() -> None:
            async def main() -> None:
                self.loop = asyncio.get_running_loop()
                self.stopped = asyncio.Event()
                server = HttpServer(self.routes, **self.options)
                self.port = await server.start("127.0.0.1", 0)
                ready.set()
                await self.stopped.wait()
                await server.stop()

            asyncio.run(main())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.thread.join(10)


PAGE = b"".join(b'DCGM_FI_DEV_GPU_TEMP{gpu="%d"} 41\n' % n for n in range(200))


def _routes(calls: list[str]) -> dict[str, Any]:
    async def page(request: Request) -> Response:
        calls.append(request.path)
        return Response(200, PAGE)

    async def secret(request: Request) -> Response:
        calls.append(request.path)
        return Response(200, b"should never be reached\n")

    return {"/metrics": page, "/secret": secret}


def test_a_request_body_is_consumed_not_parsed_as_a_second_request() -> None:
    """Issue 15: a body that looks like a request is dropped; the connection stays usable."""
    calls: list[str] = []
    with _Served(_routes(calls)) as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        smuggled = b"GET /secret HTTP/1.1\r\nHost: x\r\n\r\n"
        conn.request("POST", "/metrics", body=smuggled)
        first = conn.getresponse()
        assert first.status == 405 and first.read() == b"method not allowed\n"
        conn.request("GET", "/metrics")  # the same connection: keep-alive
        second = conn.getresponse()
        assert second.status == 200 and second.read() == PAGE
        conn.close()
    assert calls == ["/metrics"]


def test_connections_are_kept_alive_and_closed_when_asked() -> None:
    calls: list[str] = []
    with _Served(_routes(calls)) as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        sock = conn.sock
        conn.request("GET", "/metrics", headers={"Connection": "close"})
        last = conn.getresponse()
        assert conn.sock is sock or conn.sock is None  # no new connection was opened
        assert last.getheader("Connection") == "close" and last.read() == PAGE
        raw = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        raw.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # HTTP/1.0 closes unless asked not to
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
        raw.close()
        assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(PAGE)
    assert calls == ["/metrics"] * 3


def test_metrics_are_gzipped_for_clients_that_accept_it() -> None:
    calls: list[str] = []
    with _Served(_routes(calls)) as served:
        url = f"http://127.0.0.1:{served.port}/metrics"
        for accept, zipped in (
            ("gzip", True),
            ("br;q=1.0, gzip;q=0.8", True),
            ("*", True),
            ("gzip;q=0", False),
            ("identity", False),
            (None, False),
        ):
            headers = {"Accept-Encoding": accept} if accept is not None else {}
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as r:
                body = r.read()
                encoding = r.headers.get("Content-Encoding")
                assert r.headers["Vary"] == "Accept-Encoding"
            assert (encoding == "gzip") == zipped, accept
            assert (gzip.decompress(body) if zipped else body) == PAGE
            if zipped:
                assert len(body) * 5 < len(PAGE)


def _exchange(port: int, data: bytes) -> bytes:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.sendall(data)
    received = b""
    while chunk := raw.recv(65536):
        received += chunk
    raw.close()
    return received


def test_hostile_request_heads_and_bodies_are_refused_and_the_connection_closed() -> None:
    calls: list[str] = []
    with _Served(_routes(calls)) as served:
        cases = {
            b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n": b"431",
            b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n": b"431",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 70000\r\n\r\n": b"413",
            b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1c\r\nGET /secret HTTP/1.1\r\n\r\n\r\n0\r\n\r\n": b"501",
            b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n": b"400",
            # a digit int() refuses ("\u00b2".isdigit() is True), and a number past any body
            "GET /metrics HTTP/1.1\r\nContent-Length: \u00b2\r\n\r\n".encode(): b"400",
            b"GET /metrics HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n": b"413",
            b"GET /metrics HTTP/2.0\r\n\r\n": b"505",
            b"GET /metrics\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n": b"400",
        }
        for data, status in cases.items():
            answer = _exchange(served.port, data + b"GET /secret HTTP/1.1\r\n\r\n")
            assert answer.split(b" ", 2)[1] == status, data[:60]
            assert not re.search(rb"\nHTTP/1\.1 \d{3} ", answer), "one answer only"
            assert b"\r\nConnection: close\r\n" in answer
    assert calls == []


def test_stop_closes_kept_alive_idle_connections() -> None:
    """An idle kept-alive client must not keep a handler (and its 10 s read) past stop()."""
    calls: list[str] = []

    async def main() -> None:
        server = HttpServer(_routes(calls))
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        await server.stop()
        # Closed by stop() itself, well before the handler's own 10 s idle timeout would.
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    asyncio.run(main())
