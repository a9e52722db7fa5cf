"""Real containerd (CRI plugin) and a local docker-registry, with an image built by umoci and
pushed by skopeo, for image prewarm tests. Everything lives under a temp dir."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import launch_listening, stop

TOOLS = ("containerd", "docker-registry", "skopeo", "umoci")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _wait(check: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not come up")


def start_registry(work: Path, htpasswd: Path | None = None) -> tuple[int, subprocess.Popen[bytes]]:
    """A docker-registry on a loopback port it is seen listening on (tests/ports.py); with
    ``htpasswd`` (bcrypt lines) it asks for basic auth on every request."""
    auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n" if htpasswd else ""

    def launch(port: int) -> list[subprocess.Popen[bytes]]:
        conf = work / "registry.yml"
        conf.write_text(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
            f"{work / 'registry-data'}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}"
        )
        # Its access log: a test can see which requests reached the registry.
        with (work / "registry.log").open("ab") as log:
            return [
                subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=log, stderr=log)
            ]

    port, (proc,) = launch_listening(launch)
    return port, proc


@dataclass
class Cluster:
    socket: Path
    registry: str
    registry_log: Path | None = None  # the registry's access log


@contextmanager
def registry_and_containerd(work: Path, htpasswd: Path | None = None) -> Iterator[Cluster]:
    """With ``htpasswd`` (bcrypt lines), the registry asks for basic auth on every request."""
    port, reg = start_registry(work, htpasswd)
    certs = work / "certs.d" / f"127.0.0.1:{port}"
    certs.mkdir(parents=True)
    certs.joinpath("hosts.toml").write_text(
        f'server = "http://127.0.0.1:{port}"\n[host."http://127.0.0.1:{port}"]\n'
        '  capabilities = ["pull", "resolve"]\n  skip_verify = true\n'
    )
    sock = work / "containerd.sock"
    config = work / "containerd.toml"
    config.write_text(
        f'version = 2\nroot = "{work / "root"}"\nstate = "{work / "state"}"\n'
        f'[grpc]\n  address = "{sock}"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n  disable_cgroup = true\n'
        "  disable_apparmor = true\n  restrict_oom_score_adj = true\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "native"\n'
        '[plugins."io.containerd.grpc.v1.cri".registry]\n'
        f'  config_path = "{work / "certs.d"}"\n'
    )
    log = (work / "containerd.log").open("w")
    ctd = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    try:
        _wait(sock.exists, "containerd")
        yield Cluster(sock, f"127.0.0.1:{port}", work / "registry.log")
    finally:
        stop([ctd, reg])
        log.close()


def push_image(
    work: Path, registry: str, repo: str, tag: str, payload: bytes, creds: str | None = None
) -> str:
    """Build a one-layer OCI image with umoci and push it (``creds`` = user:password);
    returns the reference."""
    layout = work / "oci"
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    if not layout.exists():
        run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = work / f"bundle-{tag}"
    run("umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle))
    (bundle / "rootfs" / "payload.bin").write_bytes(payload)
    run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    ref = f"{registry}/{repo}:{tag}"
    auth = ("--dest-creds", creds) if creds else ()
    run(
        "skopeo", "copy", "--dest-tls-verify=false", *auth, f"oci:{layout}:{tag}", f"docker://{ref}"
    )
    return ref
