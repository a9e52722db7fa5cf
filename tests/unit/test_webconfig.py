"""/metrics protection from an exporter-toolkit web config: the file is checked key by key, and
a real TLS client (urllib) is refused without the client certificate or password it asks for,
while the health routes stay open to probes."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from agent.errors import InvalidSpec
from agent.http import Request, Response
from agent.webconfig import MetricsGuard, ReloadingTls, load_web_config
from tests.unit.api.support import Pki, wait_for
from tests.unit.test_http import _Served

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()  # cost 4: fast tests, same check


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_every_bad_key_is_named_and_nothing_is_silently_ignored(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "tls_server_config:\n"
        "  cert_file: server.pem\n"
        "  client_auth_type: RequireAnyClientCert\n"
        "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"
        "  min_version: TLS9\n"
        "  colour: blue\n"
        "http_server_config: {http2: false}\n"
        "basic_auth_users: {prometheus: not-a-hash}\n"
        "extra: 1\n",
    )
    with pytest.raises(InvalidSpec) as caught:
        load_web_config(path)
    fields = {v.field.removeprefix("metrics_web_config: ") for v in caught.value.violations}
    assert fields == {
        "tls_server_config.key_file",
        "tls_server_config.client_auth_type",
        "tls_server_config.cipher_suites",
        "tls_server_config.min_version",
        "tls_server_config.colour",
        "http_server_config",
        "basic_auth_users.prometheus",
        "extra",
    }


def test_verifying_client_auth_needs_a_ca_and_aliases_are_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "tls_server_config: {cert_file: a, key_file: b, client_auth_type: "
        "RequireAndVerifyClientCert}\n",
    )
    with pytest.raises(InvalidSpec) as caught:
        load_web_config(path)
    assert [v.field for v in caught.value.violations] == [
        "metrics_web_config: tls_server_config.client_ca_file"
    ]
    path = _write(tmp_path, "a: &x [1, 2]\nbasic_auth_users: *x\n")
    with pytest.raises(InvalidSpec, match="aliases"):
        load_web_config(path)


def test_paths_are_relative_to_the_file_and_the_files_must_load(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    path = _write(
        tmp_path,
        "tls_server_config:\n"
        "  cert_file: pki/server.pem\n"
        "  key_file: pki/server.key\n"
        "  client_auth_type: VerifyClientCertIfGiven\n"
        f"  client_ca_file: {pki.ca}\n"  # absolute stays absolute
        f"basic_auth_users: {{prometheus: '{HASH}'}}\n",
    )
    config = load_web_config(path)
    assert config.tls is not None and config.tls.cert_file == tmp_path / "pki" / "server.pem"
    assert config.tls.client_ca_file == pki.ca and config.users == {"prometheus": HASH.encode()}
    (tmp_path / "pki" / "server.key").write_text("not a key")
    with pytest.raises(InvalidSpec):
        load_web_config(path)


def _get(url: str, context: ssl.SSLContext, auth: str | None = None) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": auth} if auth else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), context=context, timeout=10
        ) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_tls_client_certificates_and_basic_auth_guard_metrics_not_health(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    path = _write(
        tmp_path,
        "tls_server_config:\n"
        f"  cert_file: {pki.server.cert}\n"
        f"  key_file: {pki.server.key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {pki.ca}\n"
        "  min_version: TLS12\n"
        f"basic_auth_users: {{prometheus: '{HASH}'}}\n",
    )
    config = load_web_config(path)
    assert config.tls is not None

    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    with _Served(
        {"/metrics": ok, "/healthz": ok},
        tls=ReloadingTls(config.tls).context,
        guard=MetricsGuard(config),
        protected={"/metrics"},
    ) as served:
        base = f"https://localhost:{served.port}"
        anonymous = ssl.create_default_context(cafile=str(pki.ca))
        with_cert = ssl.create_default_context(cafile=str(pki.ca))
        with_cert.load_cert_chain(pki.reader.cert, pki.reader.key)
        rogue = ssl.create_default_context(cafile=str(pki.ca))
        rogue.load_cert_chain(pki.rogue.cert, pki.rogue.key)  # another CA's certificate
        good = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
        bad = "Basic " + base64.b64encode(b"prometheus:guess").decode()

        assert _get(f"{base}/healthz", anonymous)[0] == 200  # probes need nothing
        assert _get(f"{base}/metrics", anonymous, good)[0] == 403  # no client certificate
        status, headers = _get(f"{base}/metrics", with_cert, bad)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert _get(f"{base}/metrics", with_cert)[0] == 401
        # Past bcrypt's 72 bytes: refused as any wrong password, not a 500 and a traceback.
        long = "Basic " + base64.b64encode(b"prometheus:s3cret" + b"x" * 80).decode()
        assert _get(f"{base}/metrics", with_cert, long)[0] == 401
        assert _get(f"{base}/metrics", with_cert, good)[0] == 200
        assert _get(f"{base}/metrics", with_cert, good)[0] == 200  # remembered, same answer
        # The handshake refuses a foreign CA (under TLS 1.3 the client sees the server hang up).
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _get(f"{base}/metrics", rogue, good)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: no answer
            urllib.request.urlopen(f"http://localhost:{served.port}/healthz", timeout=10)


def test_rotated_certificate_files_are_used_by_new_connections(tmp_path: Path) -> None:
    """cert-manager replaces the files in place: new handshakes get the new certificate; a
    half-written set keeps the old one."""
    old, new = Pki(tmp_path / "old"), Pki(tmp_path / "new")
    served_dir = tmp_path / "served"
    served_dir.mkdir()
    for name in ("server.pem", "server.key"):
        (served_dir / name).write_bytes((old.root / name).read_bytes())
    path = _write(
        tmp_path,
        "tls_server_config: {cert_file: served/server.pem, key_file: served/server.key}\n",
    )
    config = load_web_config(path)
    assert config.tls is not None

    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    def answers(pki: Pki) -> bool:
        try:
            context = ssl.create_default_context(cafile=str(pki.ca))
            return _get(f"https://localhost:{served.port}/metrics", context)[0] == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    with _Served({"/metrics": ok}, tls=ReloadingTls(config.tls).context) as served:
        assert answers(old) and not answers(new)
        (served_dir / "server.pem").write_text("-----BEGIN CERTIFICATE-----\ntruncated")
        assert answers(old)  # the broken set is not used
        for name in ("server.key", "server.pem"):
            staged = served_dir / f".{name}.new"
            staged.write_bytes((new.root / name).read_bytes())
            staged.replace(served_dir / name)
        assert wait_for(lambda: answers(new), "the rotated certificate", 15)
        assert not answers(old)


def test_an_unknown_user_costs_one_bcrypt_check_like_a_wrong_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answering an unknown user at once would tell an attacker which user names exist: the
    guard runs the same bcrypt check (at the configured cost) for it, and still refuses it,
    also with the stand-in hash's own empty password."""
    import asyncio

    config = load_web_config(_write(tmp_path, f"basic_auth_users: {{prometheus: '{HASH}'}}\n"))
    guard = MetricsGuard(config)
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed[:7])
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)

    def answer(credentials: bytes) -> int:
        header = "Basic " + base64.b64encode(credentials).decode()
        request = Request("GET", "/metrics", {"authorization": header})
        refused = asyncio.run(guard.refuse(request))
        return 200 if refused is None else refused.status

    assert answer(b"prometheus:guess") == 401
    assert answer(b"nobody:guess") == 401
    assert answer(b"nobody:") == 401
    assert answer(b"prometheus:s3cret") == 200
    assert checked == [HASH[:7].encode()] * 4  # every answer paid one check at cost 04


def _counting_checkpw(monkeypatch: pytest.MonkeyPatch, hold_s: float = 0.0) -> dict[str, int]:
    """Counts bcrypt checks and the most run at once; each check is held until a third one
    runs beside it or ``hold_s`` passed, so checks that could overlap do."""
    import threading

    seen = {"calls": 0, "active": 0, "most": 0}
    changed = threading.Condition()
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        with changed:
            seen["calls"] += 1
            seen["active"] += 1
            seen["most"] = max(seen["most"], seen["active"])
            changed.notify_all()
            changed.wait_for(lambda: seen["active"] >= 3, hold_s)
        try:
            return real(password, hashed)
        finally:
            with changed:
                seen["active"] -= 1

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return seen


async def _answer(guard: MetricsGuard, credentials: bytes) -> Response | None:
    header = "Basic " + base64.b64encode(credentials).decode()
    return await guard.refuse(Request("GET", "/metrics", {"authorization": header}))


def test_a_successful_check_is_remembered_so_repeated_scrapes_cost_one_bcrypt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    config = load_web_config(_write(tmp_path, f"basic_auth_users: {{prometheus: '{HASH}'}}\n"))
    guard = MetricsGuard(config)
    seen = _counting_checkpw(monkeypatch)

    async def scrapes() -> list[Response | None]:
        return [await _answer(guard, b"prometheus:s3cret") for _ in range(5)]

    assert asyncio.run(scrapes()) == [None] * 5
    assert seen["calls"] == 1
    # What is remembered is that credential: another password is checked, and refused.
    refused = asyncio.run(_answer(guard, b"prometheus:guess"))
    assert refused is not None and refused.status == 401
    assert seen["calls"] == 2


def test_bcrypt_checks_run_at_most_two_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    config = load_web_config(_write(tmp_path, f"basic_auth_users: {{prometheus: '{HASH}'}}\n"))
    guard = MetricsGuard(config)
    seen = _counting_checkpw(monkeypatch, hold_s=0.3)

    async def at_once() -> list[Response | None]:
        guesses = [f"prometheus:guess-{i}".encode() for i in range(6)]
        return await asyncio.gather(*(_answer(guard, g) for g in guesses))

    answers = asyncio.run(at_once())
    assert [a.status if a else 200 for a in answers] == [401] * 6
    assert seen["calls"] == 6
    assert seen["most"] <= 2, seen
