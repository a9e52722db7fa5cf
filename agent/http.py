"""A minimal asyncio HTTP/1.1 server for /healthz, /readyz and /metrics.

The agent needs a handful of GET endpoints on one port; a web framework would be the largest
dependency in the image for that. Requests are read with limits and a timeout so a slow client
cannot hold the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 16 * 1024
_READ_TIMEOUT_S = 10.0
_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
    400: "Bad Request",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Serves GET routes; everything else is 404/405. Call :meth:`start`, then :meth:`stop`."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await asyncio.wait_for(_read_request(reader), _READ_TIMEOUT_S)
                if request is None:
                    break
                response = await self._dispatch(request)
                writer.write(_encode(response, head=request.method == "HEAD"))
                await writer.drain()
                if request.headers.get("connection", "").lower() == "close":
                    break
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass
        finally:
            writer.close()

    async def _dispatch(self, request: Request) -> Response:
        handler = self._routes.get(request.path.split("?", 1)[0])
        if handler is None:
            return Response(404, b"not found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n")
        try:
            return await handler(request)
        except Exception:
            log.exception("handler for %s failed", request.path)
            return Response(500, b"internal error\n")


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    if len(head) > _MAX_HEADER_BYTES:
        raise ValueError("header too large")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return Request(method, path, headers)


def _encode(response: Response, *, head: bool) -> bytes:
    reason = _REASONS.get(response.status, "")
    header = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n\r\n"
    ).encode("latin-1")
    return header if head else header + response.body
