"""A minimal asyncio HTTP/1.1 server for /healthz, /readyz and /metrics.

The agent needs a handful of GET endpoints on one port; a web framework would be the largest
dependency in the image for that. The request loop follows RFC 9112 where it matters here:

* a request head is at most 16 KiB and 100 header lines (431 past them), and the next request
  must arrive within 10 s (the connection is closed then), so a slow client cannot hold the loop;
  over TLS, the handshake must finish within ``handshake_timeout_s`` (10 s unless configured);
* a body announced by Content-Length is read and dropped, up to 64 KiB (413 past it), so it is
  never parsed as a second request; Transfer-Encoding is refused (501) and the connection closed,
  since its end cannot be found without decoding it;
* connections are kept alive (HTTP/1.1 unless ``Connection: close``; HTTP/1.0 only with
  ``Connection: keep-alive``);
* bodies of 1 KiB and more are gzipped for clients that accept it (``Accept-Encoding: gzip``):
  a /metrics page shrinks about 15-fold.

Protection (TLS, client certificates, basic auth; agent/webconfig.py) applies to the routes
named ``protected``; health routes stay open so kubelet probes need no credentials.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.safeyaml import ascii_int

log = logging.getLogger(__name__)

__all__ = ["Guard", "Handler", "HttpServer", "Request", "Response"]

_MAX_HEADER_BYTES = 16 * 1024
_MAX_HEADERS = 100
_MAX_BODY_BYTES = 64 * 1024
_READ_TIMEOUT_S = 10.0
_HANDSHAKE_TIMEOUT_S = 10.0
_GZIP_MIN_BYTES = 1024
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    version: str = "HTTP/1.1"
    #: the client certificate the TLS handshake verified (``ssl.getpeercert()``); None without.
    peer_cert: Mapping[str, object] | None = None

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def accepts_gzip(self) -> bool:
        """Accept-Encoding names gzip (or *) with a q-value above 0 (RFC 9110 12.5.3)."""
        accepted: dict[str, float] = {}
        for item in self.headers.get("accept-encoding", "").split(","):
            coding, _, params = item.partition(";")
            q = 1.0
            name, _, value = params.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            accepted[coding.strip().lower()] = q
        return accepted.get("gzip", accepted.get("*", 0.0)) > 0


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    #: ``body`` gzipped ahead (the /metrics page is compressed once per change, not per scrape)
    gzipped: bytes | None = None


Handler = Callable[[Request], Awaitable[Response]]


class Guard(Protocol):
    """Decides whether a request for a protected route may be served (agent/webconfig.py)."""

    async def refuse(self, request: Request) -> Response | None:
        """None admits the request; a response (401, 403) refuses it."""
        ...


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class HttpServer:
    """Serves GET routes; everything else is 404/405. Call :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        routes: Mapping[str, Handler],
        *,
        tls: ssl.SSLContext | None = None,
        handshake_timeout_s: float = _HANDSHAKE_TIMEOUT_S,
        guard: Guard | None = None,
        protected: Collection[str] = (),
    ) -> None:
        self._routes = dict(routes)
        self._tls = tls
        self._handshake_timeout_s = handshake_timeout_s
        self._guard = guard
        self._protected = frozenset(protected)
        self._server: asyncio.Server | None = None
        # Open connections, closed on stop: a kept-alive idle client must not outlive the server.
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            ssl=self._tls,
            # asyncio's default is 60 s; a client that never finishes one is closed sooner.
            ssl_handshake_timeout=self._handshake_timeout_s if self._tls is not None else None,
            limit=_MAX_HEADER_BYTES,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):
                writer.close()  # its reader sees the end and its loop returns
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_cert = writer.get_extra_info("peercert") or None
        self._open.add(writer)
        try:
            while True:
                try:
                    async with asyncio.timeout(_READ_TIMEOUT_S):  # unlike wait_for, no task
                        request = await _read_request(reader, peer_cert)
                except _BadRequest as bad:
                    refusal = Response(bad.status, f"{bad.text}\n".encode())
                    writer.write(_encode(refusal, head=False, gzip_ok=False, close=True))
                    await writer.drain()
                    break
                if request is None:
                    break
                response = await self._dispatch(request)
                keep = request.keep_alive
                writer.write(
                    _encode(
                        response,
                        head=request.method == "HEAD",
                        gzip_ok=request.accepts_gzip,
                        close=not keep,
                    )
                )
                await writer.drain()
                if not keep:
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def _dispatch(self, request: Request) -> Response:
        path = request.path.split("?", 1)[0]
        handler = self._routes.get(path)
        if handler is None:
            return Response(404, b"not found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
        try:
            if self._guard is not None and path in self._protected:
                refused = await self._guard.refuse(request)
                if refused is not None:
                    return refused
            return await handler(request)
        except Exception:
            log.exception("handler for %s failed", path)
            return Response(500, b"internal error\n")


async def _read_request(
    reader: asyncio.StreamReader, peer_cert: Mapping[str, object] | None
) -> Request | None:
    """The next request, its body read and dropped; None when the client closed between
    requests. Raises _BadRequest for a request to answer with an error and close."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest(400, "incomplete request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest(431, f"request head over {_MAX_HEADER_BYTES} bytes") from exc
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise _BadRequest(400, "malformed request line")
    method, path, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(505, "HTTP/1.0 or HTTP/1.1 only")
    if len(lines) - 1 > _MAX_HEADERS:
        raise _BadRequest(431, f"more than {_MAX_HEADERS} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():  # also obsolete line folding
            raise _BadRequest(400, "malformed header field")
        key = name.lower()
        value = value.strip()
        if key == "content-length" and key in headers and headers[key] != value:
            raise _BadRequest(400, "conflicting Content-Length")
        headers[key] = (
            f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
        )
    if "transfer-encoding" in headers:
        raise _BadRequest(501, "Transfer-Encoding is not accepted; send a Content-Length")
    text = headers.get("content-length", "0")
    length = ascii_int(text, 18)
    if length is None and not (text.isascii() and text.isdigit()):
        raise _BadRequest(400, "Content-Length must be a number of bytes")
    if length is None or length > _MAX_BODY_BYTES:  # None here: more than 18 digits
        raise _BadRequest(413, f"request bodies are at most {_MAX_BODY_BYTES} bytes")
    if length:
        await reader.readexactly(length)  # no route takes a body: consumed, not parsed
    return Request(method.upper(), path, headers, version, peer_cert)


def _encode(response: Response, *, head: bool, gzip_ok: bool, close: bool) -> bytes:
    body = response.body
    extra = dict(response.headers)
    if len(body) >= _GZIP_MIN_BYTES:
        extra["Vary"] = "Accept-Encoding"
        if gzip_ok:
            body = response.gzipped or gzip.compress(body, compresslevel=6, mtime=0)
            extra["Content-Encoding"] = "gzip"
    if close:
        extra["Connection"] = "close"
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    header = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return header if head else header + body
