"""HTTP(S) fetcher: direct to the origin, or through dfdaemon's HTTP proxy (prewarm.md §1.2).

Streams into a `Sink` (the cache's `Partial`, or a `DigestSink` that only hashes), resuming
with ``Range`` + ``If-Range`` after a dropped connection or a restart. Every URL, redirects
included, passes `UrlPolicy`; direct connections go to the address the policy checked. Request
headers (tokens) go only to the first origin: a redirect to another origin drops them, and no
header value appears in an error or a log line. Nor does anything the origin sent: errors say
"origin answered HTTP 503" or "malformed status line", never its reason phrase or its bytes.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urljoin, urlsplit

from agent.prewarm.cancel import abandonable, hold, never, release, wait_cancelled
from agent.prewarm.errors import Cancelled, FetchFailed, transport_error
from agent.prewarm.policy import RESOLVE_DEADLINE_S, Target, UrlPolicy, origin_of, redact_url
from agent.prewarm.resume import object_change, resume_headers
from agent.prewarm.sink import Sink

log = logging.getLogger(__name__)


class ProgressFn(Protocol):
    """Bytes done of the total (None: not known yet); ``retrying`` while a fetch waits to
    resume after a transient failure (the attempt, the wait, why), "" while bytes flow."""

    def __call__(self, done: int, total: int | None, /, *, retrying: str = "") -> None: ...


CancelledFn = Callable[[], bool]


def no_progress(done: int, total: int | None, /, *, retrying: str = "") -> None:
    """For a fetch whose progress nobody watches (a listing, a manifest)."""


_BUF = 1024 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes \*/(\d+)")
_LENGTH = re.compile(r"[0-9]+")  # one Content-Length value: digits, nothing else
_DRAGONFLY_ERROR_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_DRAGONFLY_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # a sha256 hex in practice
# What a request line keeps as it is: RFC 3986's reserved and unreserved characters and "%";
# anything else (non-ASCII, spaces, controls) is percent-encoded as UTF-8.
_URI_SAFE = "!#$%&'()*+,/:;=?@[]~-._"


@dataclass(frozen=True, slots=True)
class FetchSpec:
    """What to fetch; ``headers`` hold secrets and are never logged."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    expected_sha256: str | None = None
    # What a partial's bytes belong to: the URL without its signature, so a re-signed URL
    # resumes them (None: the URL itself).
    resume_key: str | None = None


@dataclass(frozen=True, slots=True)
class FetchInfo:
    """What the fetch learned beyond the bytes (e.g. the Dragonfly task id, to match pulls)."""

    dragonfly_task_id: str | None = None
    #: How dfdaemon delivered the bytes: "stream" (pieces sent) or "hard-link" (its file linked)
    dragonfly_output: str | None = None


class _Retry(Exception):
    """A failure a later attempt may get past (dropped connection, 5xx, short body)."""


class _Restart(Exception):
    """The object changed under the partial, whose bytes are dropped: ask again from byte 0.
    Not a failure, so not an attempt; with nothing left to resume it cannot happen twice."""


class _Connection(http.client.HTTPConnection):
    """A connection its item's stop interrupts (`agent.prewarm.cancel.hold`) from before its
    connect until it closes: shutting the socket down ends a blocked connect, TLS handshake or
    read at once.

    ``addresses``: where to connect, the ones `UrlPolicy.check` returned (never a fresh DNS
    answer), or None for dfdaemon's proxy, by its configured name. ``tls``: the context and the
    name TLS verifies (through a proxy's CONNECT tunnel, the origin's), None for plain HTTP."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        addresses: tuple[str, ...] | None,
        cancelled: CancelledFn,
        tls: tuple[ssl.SSLContext, str] | None = None,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self._cancelled = cancelled
        self._tls = tls
        # The socket the stop shuts down: http.client drops ``sock`` when it hands it to a
        # ``Connection: close`` answer, whose body is still read from it.
        self._socket: socket.socket | None = None
        self._answering = False

    def connect(self) -> None:
        hold(self._cancelled, self.interrupt)  # released by close(), which every caller calls
        self.sock = self._open_socket()
        if self._tunnel_host:  # type: ignore[attr-defined]  # http.client internals
            self._tunnel()  # type: ignore[attr-defined]
        if self._tls is not None:
            context, name = self._tls
            raw = self.sock
            wrapped = context.wrap_socket(raw, server_hostname=name, do_handshake_on_connect=False)
            self.sock = self._socket = wrapped  # before the handshake, so a stop can end it
            self._check()
            wrapped.do_handshake()

    def getresponse(self) -> http.client.HTTPResponse:
        self._answering = True
        try:
            return super().getresponse()
        finally:
            self._answering = False

    def close(self) -> None:
        if not self._answering:  # else the socket lives on in the answer: still held
            release(self._cancelled, self.interrupt)
            self._socket = None
        super().close()

    def interrupt(self) -> None:
        """End whatever this connection waits on; the waiting fetch sees it is cancelled."""
        sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):
                # The plain socket's shutdown, also under TLS: it ends a handshake too.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _check(self) -> None:
        if self._cancelled():  # stopped before the socket could be interrupted
            raise Cancelled("cancelled")

    def _open_socket(self) -> socket.socket:
        last: OSError | None = None
        for family, address in self._where():
            sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock = self._socket = sock  # reachable by interrupt() while it connects
            try:
                self._check()
                sock.settimeout(self.timeout)
                sock.connect(address)
            except OSError as exc:
                sock.close()
                self.sock = self._socket = None
                last = exc
                continue
            except BaseException:
                sock.close()
                self.sock = self._socket = None
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {last}")

    def _where(self) -> list[tuple[socket.AddressFamily, tuple[str, int]]]:
        if self._addresses is not None:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, (a, self.port))
                for a in self._addresses
            ]

        def lookup() -> list[Any]:
            return socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)

        infos = abandonable(lookup, self._cancelled, RESOLVE_DEADLINE_S)
        return [(info[0], (str(info[4][0]), int(info[4][1]))) for info in infos]


def direct_connection(
    target: Target,
    timeout: float,
    ssl_context: ssl.SSLContext,
    cancelled: CancelledFn = never,
) -> http.client.HTTPConnection:
    """A connection to the addresses `UrlPolicy.check` returned, never a fresh DNS answer."""
    tls = (ssl_context, target.host) if target.scheme == "https" else None
    return _Connection(target.host, target.port, timeout, target.addresses, cancelled, tls)


class HttpFetcher:
    """Fetch one URL into a Sink; retries transient failures with exponential back-off.

    With ``proxy`` (dfdaemon's proxy, e.g. http://127.0.0.1:4001), plain-http URLs are sent in
    absolute form and https URLs through CONNECT (dfdaemon then terminates TLS, so
    ``ssl_context`` must trust its CA). ``X-Dragonfly-Use-P2P`` routes the GET through P2P
    whatever the proxy rules; tag and application stay unset so the task id matches a pod's
    later plain download of the same URL (prewarm.md §1.4).
    """

    def __init__(
        self,
        policy: UrlPolicy,
        proxy: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 1.0,
        max_redirects: int = 5,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._policy = policy
        self._proxy = urlsplit(proxy) if proxy else None
        self._timeout = timeout_s
        self._retries = retries
        self._backoff = backoff_s
        self._max_redirects = max_redirects
        self._ssl = ssl_context or ssl.create_default_context()

    @property
    def mode(self) -> str:
        return "dragonfly-proxy" if self._proxy else "direct"

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        attempt = 0
        while True:
            try:
                return self._attempt(spec, partial, progress, cancelled)
            except _Restart:
                continue
            except _Retry as exc:
                attempt += 1
                if attempt > self._retries:
                    raise FetchFailed(
                        f"fetching {redact_url(spec.url)} failed after {attempt} attempts: {exc}",
                        transient=True,
                    ) from None
                delay = min(self._backoff * 2 ** (attempt - 1), 30.0)
                log.warning(
                    "fetch of %s interrupted at %d bytes (%s); resuming in %.1fs",
                    redact_url(spec.url),
                    partial.offset,
                    exc,
                    delay,
                )
                note = f"attempt {attempt + 1} of {self._retries + 1} in {delay:.1f}s: {exc}"
                progress(partial.offset, None, retrying=note)
                _back_off(delay, cancelled)

    def _attempt(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        conn, resp = self._open(spec, partial, cancelled)
        try:
            total = self._start(spec, partial, resp)
            partial.admit(total)
            self._stream(resp, partial, total, progress, cancelled)
            return FetchInfo(dragonfly_task_id=self._task_id(resp))
        except (OSError, http.client.HTTPException) as exc:
            if cancelled():
                raise Cancelled("cancelled") from None
            raise _Retry(transport_error(exc)) from None
        finally:
            resp.close()  # a ``Connection: close`` answer holds the socket, not ``conn``
            conn.close()

    def _open(
        self, spec: FetchSpec, partial: Sink, cancelled: CancelledFn
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = spec.url
        headers = dict(spec.headers)
        origin = origin_of(url)
        for _ in range(self._max_redirects + 1):
            target = self._policy.check(url, cancelled=cancelled)
            conn = self._connection(target, cancelled)
            first = spec.resume_key or spec.url
            request_headers = self._headers(url, target, headers, partial, first)
            self._connect(conn, cancelled)
            try:
                conn.request("GET", self._request_target(url), headers=request_headers)
                resp = conn.getresponse()
            except BaseException as exc:
                # Whatever fails (a dropped connection, a header http.client cannot encode),
                # the socket is closed here: nothing else holds it.
                conn.close()
                if isinstance(exc, OSError | http.client.HTTPException):
                    if cancelled():  # the stop interrupted the wait for an answer
                        raise Cancelled("cancelled") from None
                    raise _Retry(transport_error(exc)) from None
                raise
            if resp.status not in _REDIRECTS:
                return conn, resp
            location = resp.getheader("Location")
            conn.close()
            if not location:
                raise FetchFailed(f"redirect without Location from {redact_url(url)}")
            url = urljoin(url, location)
            if origin_of(url) != origin:
                headers = {}  # tokens are for the origin the user named, not where it points
        raise FetchFailed(f"more than {self._max_redirects} redirects from {redact_url(spec.url)}")

    def _connect(self, conn: http.client.HTTPConnection, cancelled: CancelledFn) -> None:
        """Open the connection; a failure to reach dfdaemon's proxy names the proxy, not the
        origin, since the origin was never asked."""
        try:
            conn.connect()
        except BaseException as exc:
            conn.close()
            if not isinstance(exc, OSError | http.client.HTTPException):
                raise
            if cancelled():
                raise Cancelled("cancelled") from None
            if self._proxy is None:
                raise _Retry(transport_error(exc)) from None
            down = isinstance(exc, ConnectionError | TimeoutError | socket.gaierror)
            raise _Retry(
                f"Dragonfly proxy {redact_url(self._proxy.geturl())} "
                f"{'unreachable' if down else 'failed'}: {transport_error(exc)}"
            ) from None

    def _connection(self, target: Target, cancelled: CancelledFn) -> http.client.HTTPConnection:
        if self._proxy is None:
            return direct_connection(target, self._timeout, self._ssl, cancelled)
        proxy_host = self._proxy.hostname or "127.0.0.1"
        proxy_port = self._proxy.port or 80
        if target.scheme == "https":
            tls = (self._ssl, target.host)
            conn = _Connection(proxy_host, proxy_port, self._timeout, None, cancelled, tls)
            conn.set_tunnel(target.host, target.port)
            return conn
        return _Connection(proxy_host, proxy_port, self._timeout, None, cancelled)

    def _request_target(self, url: str) -> str:
        parts = urlsplit(url)
        if self._proxy is not None and parts.scheme == "http":
            return request_target(url)
        return request_target((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))

    def _headers(
        self, url: str, target: Target, headers: Mapping[str, str], partial: Sink, first: str
    ) -> dict[str, str]:
        out = {"User-Agent": "gpu-agent-prewarm", "Accept-Encoding": "identity", **headers}
        default_port = 443 if target.scheme == "https" else 80
        out["Host"] = target.host if target.port == default_port else f"{target.host}:{target.port}"
        out.update(resume_headers(partial.offset, partial.validators, first))
        if self._proxy is not None:
            out["X-Dragonfly-Use-P2P"] = "true"
            if "Range" in out:
                # A range request would only cache that range; ask dfdaemon for the whole file.
                out["X-Dragonfly-Prefetch"] = "true"
        return out

    def _start(self, spec: FetchSpec, partial: Sink, resp: http.client.HTTPResponse) -> int | None:
        """Check the status, line the partial up with the body; return the file's total size."""
        status = resp.status
        length = resp.getheader("Content-Length")
        if status in (200, 206) and length is not None and not _LENGTH.fullmatch(length):
            # http.client frames the body by the first value, or up to the close: never guess.
            raise FetchFailed(
                f"origin answered a malformed Content-Length for {redact_url(spec.url)}"
            )
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(resp.getheader("Content-Range", ""))
            if match is None or int(match[1]) != partial.offset:
                partial.restart()
                raise _Retry("origin answered a range other than the one asked")
            total = None if match[3] == "*" else int(match[3])
            if self._restart_if_changed(spec, partial, resp, total):
                raise _Restart  # these bytes continue another object: ask for all of it
        elif status == 200:
            total = int(length) if length is not None else None
            if partial.offset and not self._restart_if_changed(spec, partial, resp, total):
                log.info(
                    "origin ignored the range for %s; fetching from zero", redact_url(spec.url)
                )
                partial.restart()
        elif status == 416:
            match = _UNSATISFIED_RANGE.fullmatch(resp.getheader("Content-Range", ""))
            if match is not None and int(match[1]) == partial.offset:
                if self._restart_if_changed(spec, partial, resp, partial.offset):
                    raise _Restart  # as long as the partial, by chance: still another object
                # The partial is whole. The body is not read: it is the origin's, of any size
                # (unframed, to the close); the connection is closed with it.
                resp.close()
                return partial.offset
            partial.restart()
            raise _Retry("origin refused the resume range")
        elif status == 429 or status >= 500:
            raise _Retry(f"origin answered HTTP {status}{self._dragonfly_error(resp)}")
        else:
            raise FetchFailed(
                f"origin answered HTTP {status} for {redact_url(spec.url)}"
                f"{self._dragonfly_error(resp)}"
            )
        partial.save_validators(
            {
                "url": spec.resume_key or spec.url,
                "etag": resp.getheader("ETag"),
                "last_modified": resp.getheader("Last-Modified"),
                "total": total,
            }
        )
        return total

    def _restart_if_changed(
        self, spec: FetchSpec, partial: Sink, resp: http.client.HTTPResponse, total: int | None
    ) -> bool:
        """Drop the partial when the answer describes another object than the one its bytes
        came from (`object_change`), saying why; False when nothing known changed."""
        old = partial.validators
        if not partial.offset or old.get("url") != (spec.resume_key or spec.url):
            return False
        why = object_change(old, resp.getheader("ETag"), resp.getheader("Last-Modified"), total)
        if why is None:
            return False
        log.warning("%s: %s", redact_url(spec.url), why)
        partial.restart(why)
        return True

    def _task_id(self, resp: http.client.HTTPResponse) -> str | None:
        """dfdaemon's task id, when its proxy answered: a short token. Fetched directly, the
        header is the origin's, whose bytes never reach a caller."""
        task = resp.getheader("X-Dragonfly-Task-ID") if self._proxy is not None else None
        return task if task and _DRAGONFLY_TASK_ID.fullmatch(task) else None

    def _dragonfly_error(self, resp: http.client.HTTPResponse) -> str:
        """dfdaemon's error type, when its proxy set one: a short token, never free text."""
        kind = resp.getheader("X-Dragonfly-Error-Type") if self._proxy is not None else None
        if kind and _DRAGONFLY_ERROR_TYPE.fullmatch(kind):
            return f" (dragonfly error type: {kind})"
        return ""

    def _stream(
        self,
        resp: http.client.HTTPResponse,
        partial: Sink,
        total: int | None,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> None:
        buf = bytearray(_BUF)
        view = memoryview(buf)
        progress(partial.offset, total)
        while total is None or partial.offset < total:
            n = resp.readinto(buf)
            if not n:
                break
            partial.write(view[:n])
            progress(partial.offset, total)
            if cancelled():
                raise Cancelled("cancelled")
        if cancelled():  # the stop shut the socket: the end it made is not the origin's
            raise Cancelled("cancelled")
        if total is not None and partial.offset < total:
            raise _Retry(f"connection closed at {partial.offset} of {total} bytes")


def _back_off(delay: float, cancelled: CancelledFn) -> None:
    """Wait ``delay`` seconds between attempts, ending early with Cancelled when the item is
    cancelled or the agent stops: a retrying fetch must never hold up a shutdown."""
    if wait_cancelled(cancelled, delay):
        raise Cancelled("cancelled during the retry back-off")


def request_target(text: str) -> str:
    """``text`` (a path and query, or an absolute URL) as an ASCII request target: characters
    a request line cannot carry are percent-encoded, as a browser sends them."""
    return quote(text, safe=_URI_SAFE)
