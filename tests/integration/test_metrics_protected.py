"""A real Prometheus scrapes a real agent whose /metrics is protected by an exporter-toolkit web
config (TLS, a client certificate, basic auth with a bcrypt hash): the scrape with the right
credentials is up and carries the GPU series; without the password or without the client
certificate the target is down. Prometheus asks for gzip, so its parse of the gzipped page is
checked too.

Needs the Debian ``prometheus`` package, as tests/integration/test_telemetry_prometheus.py does.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from tests.unit.api.support import InProcessAgent, Pki, agent_config, wait_for

pytestmark = pytest.mark.integration


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def _start_prometheus(binary: str, config: Path, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus on a random loopback port, tried again on another when that one is taken
    (Prometheus binds it itself; nothing here reserves a port and lets it go)."""
    for attempt in range(10):
        port = random.randint(20_000, 60_000)
        log = root / f"prometheus-{attempt}.log"
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={root / f'tsdb-{attempt}'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

        def started(process: subprocess.Popen[bytes] = process, log: Path = log) -> str | None:
            text = log.read_text(errors="replace")
            if "Server is ready to receive web requests" in text:
                return "ready"
            if process.poll() is not None:
                return "exited"
            return None

        if wait_for(started, "prometheus to start", 60) == "ready":
            return process, f"http://127.0.0.1:{port}"
        if "address already in use" not in log.read_text(errors="replace"):
            raise AssertionError(log.read_text(errors="replace"))
    raise AssertionError("no free port for prometheus in 10 tries")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[InProcessAgent, Pki]]:
    pki = Pki(tmp_path / "pki")
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"scrape-secret", bcrypt.gensalt(10)).decode()
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": "pki/server.pem",
                    "key_file": "pki/server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": "pki/ca.pem",
                },
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    config = agent_config(tmp_path, metrics_web_config=str(web))
    with InProcessAgent(tmp_path, config) as running:
        yield running, pki


def test_real_prometheus_scrapes_over_tls_with_basic_auth_and_client_cert(
    tmp_path: Path, agent: tuple[InProcessAgent, Pki]
) -> None:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get update && apt-get install -y prometheus"
    running, pki = agent
    target = f"127.0.0.1:{running.node.metrics_port}"
    tls = {"ca_file": str(pki.ca), "server_name": "localhost"}
    client = {"cert_file": str(pki.reader.cert), "key_file": str(pki.reader.key)}

    def job(name: str, tls_config: dict[str, str], password: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": "https",
            "tls_config": tls_config,
            "basic_auth": {"username": "prometheus", "password": password},
            "static_configs": [{"targets": [target]}],
        }

    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    job("protected", {**tls, **client}, "scrape-secret"),
                    job("wrong-password", {**tls, **client}, "guess"),
                    job("no-client-cert", tls, "scrape-secret"),
                ],
            }
        )
    )
    process, url = _start_prometheus(binary, config, tmp_path)
    try:

        def up() -> dict[str, float] | None:
            found = {r["metric"]["job"]: float(r["value"][1]) for r in _query(url, "up")}
            return found if len(found) == 3 else None

        wait_for(up, "a scrape of every job", 60)
        assert wait_for(lambda: (up() or {}).get("protected") == 1.0, "the protected scrape", 60)
        states = up()
        assert states == {"protected": 1.0, "wrong-password": 0.0, "no-client-cert": 0.0}
        temps = _query(url, 'DCGM_FI_DEV_GPU_TEMP{job="protected"}')
        assert len(temps) == 8
        assert _query(url, 'count(DCGM_FI_DEV_GPU_TEMP{job!="protected"})') == []
    finally:
        process.terminate()
        process.wait(timeout=30)
