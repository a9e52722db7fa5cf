"""Redirects resolved by the agent before dfdaemon fetches (prewarm.md §1.2, §1.7).

dfdaemon follows an origin's redirects itself, so through its proxy or gRPC socket the agent
would never see where a URL leads, and `UrlPolicy` (link-local, metadata, host lists) would
hold for the first URL only. `ResolvingFetcher` first follows the redirects directly, checking
every hop and connecting only to the checked addresses, with a one-byte ranged GET; dfdaemon is
then asked for the final URL. A URL that does not redirect goes to dfdaemon unchanged, so its
task id is the one a pod's own download of that URL gets; a redirected one is cached under the
final URL's task id. An origin that answers the probe and dfdaemon's request differently can
still lead dfdaemon elsewhere: the probe narrows the gap, it cannot close it.
"""

from __future__ import annotations

import http.client
import ssl
from dataclasses import replace
from urllib.parse import urljoin, urlsplit

from agent.prewarm.errors import Cancelled, FetchFailed, transport_error
from agent.prewarm.fetch_http import (
    CancelledFn,
    FetchInfo,
    FetchSpec,
    ProgressFn,
    direct_connection,
    request_target,
)
from agent.prewarm.policy import UrlPolicy, origin_of, redact_url
from agent.prewarm.ports import FileFetcher
from agent.prewarm.sink import Sink

_REDIRECTS = (301, 302, 303, 307, 308)


def resolve(
    policy: UrlPolicy,
    spec: FetchSpec,
    ssl_context: ssl.SSLContext,
    cancelled: CancelledFn,
    timeout_s: float = 30.0,
    max_redirects: int = 5,
) -> FetchSpec:
    """``spec`` pointed at where its URL's redirects end, each hop allowed by ``policy``;
    request headers (tokens) are dropped once the chain leaves the first origin. The item's
    stop (``cancelled``) ends a lookup or a probe that waits on its peer."""
    url, headers = spec.url, dict(spec.headers)
    first = origin_of(url)
    for _ in range(max_redirects + 1):
        target = policy.check(url, cancelled=cancelled)
        conn = direct_connection(target, timeout_s, ssl_context, cancelled)
        parts = urlsplit(url)
        path = request_target((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        default_port = 443 if target.scheme == "https" else 80
        host = target.host if target.port == default_port else f"{target.host}:{target.port}"
        probe = {
            "User-Agent": "gpu-agent-prewarm",
            "Accept-Encoding": "identity",
            **headers,
            "Host": host,
            "Range": "bytes=0-0",
        }
        try:
            conn.request("GET", path, headers=probe)
            resp = conn.getresponse()
            location = resp.getheader("Location")
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            if cancelled():
                raise Cancelled("cancelled") from None
            raise FetchFailed(
                f"cannot reach {redact_url(url)} to resolve its redirects: {transport_error(exc)}",
                transient=True,
            ) from None
        finally:
            conn.close()
        if status not in _REDIRECTS:
            return replace(spec, url=url, headers=headers)
        if not location:
            raise FetchFailed(f"redirect without Location from {redact_url(url)}")
        url = urljoin(url, location)
        if origin_of(url) != first:
            headers = {}
    raise FetchFailed(f"more than {max_redirects} redirects from {redact_url(spec.url)}")


class ResolvingFetcher:
    """A dfdaemon fetcher (proxy or gRPC) that is handed URLs with their redirects resolved."""

    def __init__(
        self, inner: FileFetcher, policy: UrlPolicy, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._inner = inner
        self._policy = policy
        self._ssl = ssl_context or ssl.create_default_context()

    @property
    def mode(self) -> str:
        return self._inner.mode

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        resolved = resolve(self._policy, spec, self._ssl, cancelled)
        # The partial's bytes still belong to the URL the user named.
        resolved = replace(resolved, resume_key=spec.resume_key or spec.url)
        return self._inner.fetch(resolved, partial, progress, cancelled)
