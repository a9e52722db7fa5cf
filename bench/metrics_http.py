"""What /metrics costs on the wire and per scrape: identity vs gzip, and with TLS + basic auth.

A real agent (the whole `Node`, in this process) on a simulated DGX H100; a client keeps one
connection alive and scrapes back to back with Prometheus' Accept header, as Prometheus does.
Rows: plain HTTP without and with ``Accept-Encoding: gzip``; TLS with basic auth (bcrypt cost 10)
and gzip, where only the first scrape pays for bcrypt (successes are remembered).

Usage (from the repository root):  .venv/bin/python -m bench.metrics_http [--scrapes N]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import bcrypt
import yaml

from tests.unit.api.support import InProcessAgent, agent_config

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _scrapes(conn: http.client.HTTPConnection, n: int, headers: dict[str, str]) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        body = response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    times.append(float(len(body)))  # the last entry: body bytes
    return times


def _row(name: str, samples: list[float]) -> str:
    *times, size = samples
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"| {name} | {size / 1000:.1f} | {statistics.median(ms):.2f} | {p99:.2f} |"


def _self_signed(root: Path) -> tuple[Path, Path]:
    key, cert = root / "tls.key", root / "tls.crt"
    command = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=x",
        "-addext",
        "subjectAltName=DNS:localhost",
    ]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    return cert, key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per row")
    args = parser.parse_args()
    rows = ["| scrape | body (kB) | p50 (ms) | p99 (ms) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain, tls = root / "plain", root / "tls"
        plain.mkdir()
        tls.mkdir()
        with InProcessAgent(plain, agent_config(plain)) as agent:
            time.sleep(2)  # a few samples in, as on a running node
            assert agent.node.metrics_port is not None
            conn = http.client.HTTPConnection("127.0.0.1", agent.node.metrics_port)
            accept = {"Accept": PROMETHEUS_ACCEPT}
            _scrapes(conn, 5, accept)  # warm-up
            rows.append(_row("HTTP, identity", _scrapes(conn, args.scrapes, accept)))
            zipped = {**accept, "Accept-Encoding": "gzip"}
            rows.append(_row("HTTP, gzip", _scrapes(conn, args.scrapes, zipped)))
            conn.close()
        cert, key = _self_signed(tls)
        hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(10)).decode()
        web = tls / "web.yml"
        web.write_text(
            yaml.safe_dump(
                {
                    "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                    "basic_auth_users": {"prometheus": hashed},
                }
            )
        )
        with InProcessAgent(tls, agent_config(tls, metrics_web_config=str(web))) as agent:
            time.sleep(2)
            assert agent.node.metrics_port is not None
            context = ssl.create_default_context(cafile=str(cert))
            conn = http.client.HTTPSConnection(
                "localhost", agent.node.metrics_port, context=context
            )
            auth = "Basic " + base64.b64encode(b"prometheus:secret").decode()
            headers = {
                "Accept": PROMETHEUS_ACCEPT,
                "Accept-Encoding": "gzip",
                "Authorization": auth,
            }
            rows.append(_row("TLS + basic auth, first scrape (bcrypt)", _scrapes(conn, 1, headers)))
            rows.append(_row("TLS + basic auth, gzip", _scrapes(conn, args.scrapes, headers)))
            conn.close()
    print("\n".join(rows))
    print(f"\nCommand: .venv/bin/python -m bench.metrics_http --scrapes {args.scrapes}")


if __name__ == "__main__":
    main()
