"""Test support for the gRPC API: a throw-away PKI (openssl CLI), agent configs, and agents run
in-process (on a thread) or as a separate ``gpu-agent … serve`` process."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

REPO = Path(__file__).resolve().parents[3]

COORDINATOR = "spiffe://cluster/ns/gpu-system/sa/coordinator"
READER = "spiffe://cluster/ns/monitoring/sa/dashboard"
PREWARMER = "spiffe://cluster/ns/ml-team/sa/prewarm"
MIG_OPERATOR = "spiffe://cluster/ns/gpu-system/sa/mig-operator"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Identity:
    cert: Path
    key: Path

    def credentials(self, ca: Path) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            ca.read_bytes(), self.key.read_bytes(), self.cert.read_bytes()
        )


class Pki:
    """A CA with a server certificate and client certificates, plus a rogue CA."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = self._ca("ca", "gpu-agent test CA")
        self.rogue_ca = self._ca("rogue-ca", "somebody else's CA")
        self.server = self.issue("server", "DNS:localhost,IP:127.0.0.1")
        self.coordinator = self.issue("coordinator", f"URI:{COORDINATOR}")
        self.reader = self.issue("reader", f"URI:{READER}")
        self.prewarmer = self.issue("prewarmer", f"URI:{PREWARMER}")
        self.mig_operator = self.issue("mig-operator", f"URI:{MIG_OPERATOR}")
        # The coordinator's identity where it does not count: an email SAN, an IP SAN and the
        # subject's common name (issue 16: an email SAN could mutate).
        self.impostor = self.issue(
            "impostor", f"email:{COORDINATOR},IP:127.0.0.1", common_name=COORDINATOR
        )
        self.rogue = self.issue("rogue", f"URI:{COORDINATOR}", ca="rogue-ca")

    def _ca(self, name: str, subject: str) -> Path:
        key, cert = self.root / f"{name}.key", self.root / f"{name}.pem"
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            f"/CN={subject}",
        )
        return cert

    def issue(
        self,
        name: str,
        san: str,
        *,
        ca: str = "ca",
        out: Path | None = None,
        common_name: str | None = None,
        usage: str = "serverAuth,clientAuth",
    ) -> Identity:
        """A certificate with ``san`` signed by ``ca``, written to ``out`` (default: the root)."""
        out = out or self.root
        out.mkdir(parents=True, exist_ok=True)
        key, csr, cert = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.pem"
        ext = out / f"{name}.ext"
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            "/CN=" + (common_name or name).replace("/", "\\/"),  # -subj separates with /
        )
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.root / f"{ca}.pem"),
            "-CAkey",
            str(self.root / f"{ca}.key"),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            "2",
            "-extfile",
            str(ext),
        )
        return Identity(cert, key)


def agent_config(root: Path, pki: Pki | None = None, **extra: Any) -> Path:
    """A config for an agent on a simulated node under ``root``; TCP mTLS when ``pki``."""
    (root / "plugin").mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "metrics_listen": "127.0.0.1:0",
        "grpc_listen": "127.0.0.1:0",
        "socket_path": str(root / "agent.sock"),
        "sharing": {"config_path": str(root / "plugin" / "config.yaml"), "reload": "none"},
        "prewarm": {
            "cache_dir": str(root / "cache"),
            # Loopback only: tests and fuzzing must never fetch from anywhere else.
            "allowed_hosts": ["127.0.0.1"],
            "egress_allow": ["127.0.0.0/8", "::1"],  # loopback is denied unless opened
            "allow_http": True,
            "containerd_socket": str(root / "containerd.sock"),
        },
        "telemetry": {"kubelet_socket": str(root / "kubelet.sock")},
        "log_level": "info",
    }
    if pki is not None:
        config["tls"] = {
            "cert_file": str(pki.server.cert),
            "key_file": str(pki.server.key),
            "ca_file": str(pki.ca),
        }
        config["roles"] = {
            "admin": [COORDINATOR],
            "prewarm": [PREWARMER],
            "mig": [MIG_OPERATOR],
        }
    for key, value in extra.items():
        config[key] = value
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(check: Any, what: str, timeout: float = 30.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


#: How long a ``serve`` may take to say it serves, counted from before its interpreter starts:
#: 5 to 8 s beside two CPU hogs, several times that among other test runs (load 15 and more).
START_S = 180.0
_SERVING = re.compile(r"agent serving: metrics \S*:(\d+), gRPC (?:mTLS :(\d+)|TCP off)")


def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path`` on the agent's HTTP port at 127.0.0.1, error statuses
    included (/readyz's 503 is an answer, not a failure)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class AgentProcess:
    """``gpu-agent --simulate dgx-h100 --state-dir D --config C serve`` as a child process."""

    def __init__(self, root: Path, config: Path, preset: str = "dgx-h100") -> None:
        self.root = root
        self.config = config
        self.preset = preset
        self.state_dir = root / "state"
        self.socket = root / "agent.sock"
        self.log = root / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.tcp_port: int | None = None
        self.metrics_port: int | None = None
        self.nofile: int | None = None  # RLIMIT_NOFILE of the child, when set
        self.env: dict[str, str] = {}  # added to the child's environment

    def start(self, timeout: float = START_S) -> AgentProcess:
        offset = self.spawn()

        def serving() -> re.Match[str] | None:
            return _SERVING.search(self.output_since(offset))

        match = wait_for(serving, "the agent to serve", timeout)
        self.metrics_port = int(match.group(1))
        self.tcp_port = int(match.group(2)) if match.group(2) else None
        return self

    def output_since(self, offset: int) -> str:
        """The log from byte ``offset`` on; AssertionError (with the log) once the agent exited."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.output()}")
        return self.log.read_bytes()[offset:].decode(errors="replace")

    def spawn(self) -> int:
        """Start the process without waiting for it to serve; the log's offset it writes from."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent.cli.main",
                    "--simulate",
                    self.preset,
                    "--state-dir",
                    str(self.state_dir),
                    "--config",
                    str(self.config),
                    "serve",
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                preexec_fn=None if self.nofile is None else self._limit_files,
            )
        return offset

    def _limit_files(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as a crash or the OOM killer would leave things."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def timed_terminate(self, timeout: float = 30.0) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds from the signal to the process's exit, the
        agent's own shutdown (its start-up and the test's set-up are outside it)."""
        started = time.monotonic()
        code = self.terminate(timeout)
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class InProcessAgent:
    """The whole agent (`agent.node.Node`) on a thread of the test process."""

    def __init__(
        self, root: Path, config: Path, preset: str = "dgx-h100", *, latency: bool = False
    ) -> None:
        from agent.config import load_config

        self.latency = latency  # the simulator's NVML latencies: off, tests run at memory speed
        self.config = load_config(
            config, env={}, flags={"simulate": preset, "state_dir": root / "state"}
        )
        self.socket = self.config.socket_path
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.node: Any = None

    def __enter__(self) -> InProcessAgent:
        from agent.node import Node, build_services

        self.node = Node(build_services(self.config, simulated_latency=self.latency))

        def serve() -> None:
            async def main() -> None:
                self._loop = asyncio.get_running_loop()
                await self.node.run(handle_signals=False)

            try:
                asyncio.run(main())
            except BaseException as exc:  # surfaced by __exit__
                self._error = exc

        self._thread = threading.Thread(target=serve, name="agent", daemon=True)
        self._thread.start()
        wait_for(lambda: self.node.ready or self._error, "the in-process agent")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self.node.request_stop)
        self._thread.join(60)
        if self._error is not None:
            raise self._error


@contextmanager
def unix_channel(socket: Path) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        yield channel
