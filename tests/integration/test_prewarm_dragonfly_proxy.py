"""Dragonfly proxy mode against a real forward proxy (Debian tinyproxy stands in for dfdaemon's
:4001): requests go through the proxy with the X-Dragonfly-* headers, and resume still works."""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from agent.config import PrewarmSettings
from agent.prewarm.factory import fetcher_from
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.model import FileRequest, ItemState
from agent.prewarm.policy import UrlPolicy
from tests.integration.prewarm_fixtures.agent import LOOPBACK, make_service
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.prewarm_fixtures.recording_proxy import RecordingProxy
from tests.integration.prewarm_fixtures.tinyproxy import tinyproxy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("tinyproxy") and not Path("/usr/bin/tinyproxy").exists(),
        reason="Debian package tinyproxy is not installed (scripts/test installs it)",
    ),
]
MIB = 1024 * 1024


def test_files_go_through_the_proxy_with_dragonfly_headers(tmp_path: Path, origin: Origin) -> None:
    digest = origin.add("w.bin", (b"dragonfly" * MIB)[: 2 * MIB])
    with tinyproxy(tmp_path) as (proxy, log):
        svc = make_service(tmp_path, proxy=proxy)
        item = svc.run(svc.submit(FileRequest(origin.url("w.bin"), sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    assert item.options["via"] == "dragonfly-proxy"
    [seen] = origin.requests
    assert seen.headers["X-Dragonfly-Use-P2P"] == "true"
    assert "tinyproxy" in seen.headers.get("Via", "")  # it really crossed the proxy
    assert origin.url("w.bin") in log.read_text()


def test_resume_through_the_proxy_asks_dfdaemon_for_the_whole_file(
    tmp_path: Path, origin: Origin
) -> None:
    """A resumed Range request carries X-Dragonfly-Prefetch so dfdaemon caches all of it."""
    digest = origin.add("r.bin", hashlib.sha256(b"r").digest() * (4 * MIB // 32))
    origin.faults.drop_after["/r.bin"] = MIB
    with tinyproxy(tmp_path) as (proxy, _):
        svc = make_service(tmp_path, proxy=proxy)
        item = svc.run(svc.submit(FileRequest(origin.url("r.bin"), sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    resumed = [r for r in origin.requests if "Range" in r.headers]
    assert resumed and resumed[0].headers["X-Dragonfly-Prefetch"] == "true"
    assert resumed[0].headers["Range"] == f"bytes={MIB}-"


def test_an_unreachable_proxy_is_named_not_blamed_on_the_origin(
    tmp_path: Path, origin: Origin
) -> None:
    """A port bound but not listening refuses connections, and no one else can take it."""
    origin.add("u.bin", b"x" * 1000)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        svc = make_service(tmp_path, proxy=proxy, retries=1)
        item = svc.run(svc.submit(FileRequest(origin.url("u.bin"))).id)
    assert item.state is ItemState.FAILED
    assert f"Dragonfly proxy {proxy} unreachable" in (item.error or "")
    assert item.retry_at is not None  # the proxy may come back: retried by the agent
    assert origin.requests == []


def _pki(work: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signs (openssl CLI)."""
    ca_key, ca, key, csr, cert = (work / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem"))
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=dfdaemon test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    ext = work / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


def test_dragonfly_ca_file_is_trusted_for_https_through_the_proxy(tmp_path: Path) -> None:
    """dfdaemon presents certificates signed by its CA for https URLs; with
    prewarm.dragonfly_ca_file the agent trusts them, without it the fetch is refused."""
    ca, cert, key = _pki(tmp_path)
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as tls_origin, tinyproxy(tmp_path) as (proxy, _):
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        tls_origin.server.socket = server_ctx.wrap_socket(
            tls_origin.server.socket, server_side=True
        )
        digest = tls_origin.add("t.bin", b"tls" * 10000)
        url = f"https://127.0.0.1:{tls_origin.port}/t.bin"
        policy = UrlPolicy(egress_allow=LOOPBACK)
        settings = PrewarmSettings(dragonfly_proxy=proxy, dragonfly_ca_file=ca)
        trusting = make_service(tmp_path / "a", fetcher=fetcher_from(settings, policy))
        item = trusting.run(trusting.submit(FileRequest(url, sha256=digest)).id)
        assert item.state is ItemState.READY, item.error
        plain = make_service(
            tmp_path / "b", fetcher=HttpFetcher(policy, proxy=proxy, retries=0, timeout_s=10)
        )
        refused = plain.run(plain.submit(FileRequest(url, sha256=digest)).id)
    assert refused.state is ItemState.FAILED and "CERTIFICATE_VERIFY_FAILED" in (
        refused.error or ""
    )


def test_redirect_policy_holds_when_dfdaemon_follows_redirects(tmp_path: Path) -> None:
    """The proxy follows redirects itself (as dfdaemon does): the agent resolves them first,
    so a redirect to a denied address is refused and that address never asked; an allowed
    redirect reaches dfdaemon as its final URL."""
    roots = [tmp_path / "o1", tmp_path / "o2"]
    for r in roots:
        r.mkdir()
    with (
        Origin(roots[0]) as public,
        Origin(roots[1], host="127.0.0.2") as private,
        RecordingProxy(follow_redirects=True) as dfdaemon,
    ):
        private.add("secret.bin", b"s" * 1000)
        digest = public.add("model.bin", b"m" * 5000)
        public.faults.redirects["/evil"] = f"http://127.0.0.2:{private.port}/secret.bin"
        public.faults.redirects["/moved"] = public.url("model.bin")
        policy = UrlPolicy(allow_http=True, denied_hosts=("127.0.0.2/32",), egress_allow=LOOPBACK)
        settings = PrewarmSettings(dragonfly_proxy=f"http://{dfdaemon.address}")
        svc = make_service(tmp_path, fetcher=fetcher_from(settings, policy), policy=policy)
        refused = svc.run(svc.submit(FileRequest(public.url("evil"), name="evil")).id)
        moved = svc.run(svc.submit(FileRequest(public.url("moved"), sha256=digest)).id)
    assert refused.state is ItemState.FAILED and "denied" in (refused.error or "")
    assert private.requests == []
    assert moved.state is ItemState.READY, moved.error
    assert [r.url for r in dfdaemon.requests] == [public.url("model.bin")]
