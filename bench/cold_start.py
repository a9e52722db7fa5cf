"""Cold start, measured: a node boots with its driver late, prewarm runs first, and a pod's
start after prewarm is timed side by side with the same pod's start on a cold node.

    .venv/bin/python bench/cold_start.py [--model-mib 200] [--image-mib 32] [--rate-mib 50]
                                         [--driver-absent-s 20]

Real parts: a `gpu-agent serve` process on a simulated dgx-h100 whose driver is absent for
``--driver-absent-s`` seconds (`SimControl.driver_absent`, as `gpu-agent sim driver-absent
--for`); containerd with the CRI plugin and a local docker-registry (the test fixtures); a
Hugging Face style origin (the test origin and hub fixture); the Kubernetes API stand-in
(tests/kube/fake_api.py) over TLS, which the agent reaches as it would in a pod (service-account
token and CA, in a private mount namespace so nothing outside the agent sees them).

The registry and the origin are reached through one paced link (``--rate-mib``, MiB/s, shared
by every connection as a node's NIC is), so the agent's parallel fetches buy no extra bandwidth:
warm and cold move the same bytes over the same link.

Timeline, from the agent's start: it serves; the desired prewarm (a manifest of one image and
one multi-file model) is applied with `gpu-agent prewarm apply`; each item turns ready (the
label the agent computes) and its `gpu-agent.io/cache.<name>=ready` label appears on the Node;
the driver attaches (GetNode lists the GPUs, `gpu_agent_driver_ready 1`).

Then a pod's start: the image present in containerd, and every model file opened and its
sha256 checked. Warm: after prewarm (CRI ImageStatus, the files under the cache's by-name
directory). Cold: a node without prewarm (CRI PullImage of another image of the same size, as
the kubelet pulls; the model with `curl --parallel` over the same link, then the same check).
Goals: warm <= 1/20 of cold; prewarm done before the driver is up.

Needs root (containerd, the mount namespace), Debian containerd, docker-registry, skopeo,
umoci, and curl, openssl, unshare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from agent.client import AgentClient
from agent.gpu.sim import SimControl, open_simulator
from agent.prewarm.images import CriPuller
from agent.prewarm.labels import READY_VALUE, node_labels
from agent.prewarm.model import ItemState
from agent.prewarm.naming import label_key
from tests.integration.prewarm_fixtures import cri, hub
from tests.integration.prewarm_fixtures.origin import Origin
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import make_tls_cert
from tests.unit.api.support import agent_config, wait_for

MIB = 1024 * 1024
REPO = Path(__file__).resolve().parents[1]
NODE = "gpu-node-1"
IMAGE, MODEL = "serving-image", "serving-model"
CHUNK = 64 * 1024
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run here
TOOLS = (*cri.TOOLS, "curl", "openssl", "unshare")


class Link:
    """One paced link: every chunk any connection receives takes the next slot of the
    schedule, so all connections together get ``rate`` bytes/s, as through one NIC."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._free = 0.0

    def pass_through(self, n: int) -> None:
        with self._lock:
            start = max(time.monotonic(), self._free)
            self._free = start + n / self.rate
            until = self._free
        if (ahead := until - time.monotonic()) > 0:
            time.sleep(ahead)


@contextmanager
def through(link: Link, upstream: int) -> Iterator[int]:
    """A TCP port on 127.0.0.1 that forwards to ``upstream``; replies pass through ``link``."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            up = socket.create_connection(("127.0.0.1", upstream))
            down: socket.socket = self.request

            def requests() -> None:
                try:
                    while data := down.recv(CHUNK):
                        up.sendall(data)
                except OSError:
                    pass
                with suppress(OSError):  # the reply side may have closed it already
                    up.shutdown(socket.SHUT_WR)

            threading.Thread(target=requests, daemon=True).start()
            try:
                while data := up.recv(CHUNK):
                    link.pass_through(len(data))
                    down.sendall(data)
            except OSError:
                pass
            finally:
                up.close()

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def plain_http_registry(certs_d: Path, port: int) -> str:
    """containerd's hosts.toml for a plain-HTTP registry at ``port`` (as the fixture writes
    for its own registry); returns the host name of image references."""
    host = f"127.0.0.1:{port}"
    (certs_d / host).mkdir(parents=True)
    (certs_d / host / "hosts.toml").write_text(
        f'server = "http://{host}"\n[host."http://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n  skip_verify = true\n'
    )
    return host


def model_files(size: int) -> dict[str, bytes]:
    """A repo snapshot: config, tokenizer and 4 safetensors shards of random bytes."""
    shards = 4
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b'{"version": "1.0"}'}
    for i in range(1, shards + 1):
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = os.urandom(size // shards)
    return files


def verify_model(directory: Path, digests: dict[str, str]) -> None:
    """What the pod does before it serves: open every file and check its sha256."""
    for path, want in digests.items():
        digest = hashlib.sha256()
        with (directory / path).open("rb") as f:
            while block := f.read(4 * MIB):
                digest.update(block)
        if digest.hexdigest() != want:
            raise SystemExit(f"{directory / path}: sha256 mismatch")


def warm_pod(
    puller: CriPuller, ref: str, model: Path, digests: dict[str, str]
) -> tuple[float, float]:
    """A pod's start on the prewarmed node: the kubelet's ImageStatus (IfNotPresent finds the
    image, no pull), then the model opened from the cache. (image s, whole start s)."""
    start = time.perf_counter()
    if not puller.status(ref).id:
        raise SystemExit("the prewarmed image is not in containerd")
    image = time.perf_counter() - start
    verify_model(model, digests)
    return image, time.perf_counter() - start


def cold_pod(
    puller: CriPuller, ref: str, source: str, into: Path, digests: dict[str, str]
) -> tuple[float, float]:
    """The same pod's start on a node without prewarm: the kubelet's CRI PullImage, then the
    model downloaded over the same link (8 files at a time, as a loader would) and checked."""
    start = time.perf_counter()
    if not puller.pull(ref, None).cold:
        raise SystemExit("the cold pull was not cold")
    image = time.perf_counter() - start
    urls: list[str] = []
    for path in digests:
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        urls += ["-o", str(into / path), f"{source}/{path}"]
    subprocess.run(
        ["curl", "-sfS", "--no-progress-meter", "--parallel", "--parallel-max", "8", *urls],
        check=True,
    )
    verify_model(into, digests)
    return image, time.perf_counter() - start


def start_agent(root: Path, config: Path, sa: Path, api_port: int) -> subprocess.Popen[bytes]:
    """`gpu-agent serve` as in a pod: the service account at its path, in a mount namespace
    of its own (a tmpfs on /run), and KUBERNETES_SERVICE_HOST/PORT naming the API stand-in."""
    mount = (
        f'mount -t tmpfs tmpfs /run && mkdir -p {SA_DIR} && mount --bind {sa} {SA_DIR} && exec "$@"'
    )
    serve = [sys.executable, "-m", "agent.cli.main", "--simulate", "dgx-h100",
             "--state-dir", str(root / "state"), "--config", str(config), "serve"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api_port),
    }
    log = (root / "agent.log").open("wb")
    return subprocess.Popen(
        ["unshare", "-m", "sh", "-c", mount, "sh", *serve],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def cli(root: Path, config: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "--simulate", "dgx-h100",
         "--state-dir", str(root / "state"), "--config", str(config), *args],
        cwd=REPO,
        check=True,
        capture_output=True,
    )  # fmt: skip


def driver_ready(metrics_port: int) -> bool:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return re.search(r"^gpu_agent_driver_ready\{[^}]*\} 1(\.0)?$", text, re.M) is not None


def timeline(
    root: Path,
    config: Path,
    manifest: Path,
    api: FakeKubeApi,
    sa: Path,
    api_port: int,
    driver_absent_s: float,
) -> dict[str, float]:
    """Boot the agent with the driver absent, apply the desired prewarm; seconds from the
    agent's start to each event."""
    open_simulator(root / "state", "dgx-h100")
    SimControl(root / "state").driver_absent(for_s=driver_absent_s)
    start = time.monotonic()
    agent = start_agent(root, config, sa, api_port)
    t: dict[str, float] = {}
    try:

        def serving() -> re.Match[str] | None:
            if agent.poll() is not None:
                raise SystemExit(f"agent exited:\n{(root / 'agent.log').read_text()}")
            return re.search(r"agent serving: metrics \S*:(\d+)", (root / "agent.log").read_text())

        metrics_port = int(wait_for(serving, "the agent to serve", 60, 0.02).group(1))
        t["agent serving (API, /metrics, prewarm; no driver)"] = time.monotonic() - start
        cli(root, config, "prewarm", "apply", str(manifest), "--no-wait")
        t["desired prewarm applied (prewarm apply)"] = time.monotonic() - start
        client = AgentClient.connect(root / "agent.sock")
        assert client is not None
        wanted = {
            f"{IMAGE} ready (label the agent computes)": ("item", IMAGE),
            f"{MODEL} ready (label the agent computes)": ("item", MODEL),
            f"Node label {label_key(IMAGE)}=ready": ("node", IMAGE),
            f"Node label {label_key(MODEL)}=ready": ("node", MODEL),
            "driver attached (GPUs listed, gpu_agent_driver_ready 1)": ("driver", ""),
        }
        deadline = time.monotonic() + driver_absent_s + 60
        try:
            while len(t) < 2 + len(wanted):
                if time.monotonic() > deadline or agent.poll() is not None:
                    missing = [k for k in wanted if k not in t]
                    raise SystemExit(
                        f"never happened: {missing}\n{(root / 'agent.log').read_text()}"
                    )
                items = client.list_prewarm_items()
                failed = [i for i in items if i.state is ItemState.FAILED]
                if failed:
                    raise SystemExit(f"prewarm failed: {[(i.name, i.error) for i in failed]}")
                computed = node_labels(items)
                with api.lock:
                    on_node = dict(api.nodes.get(NODE, {}))
                for event, (kind, name) in wanted.items():
                    if event in t:
                        continue
                    if kind == "item":
                        done = computed.get(label_key(name)) == READY_VALUE
                    elif kind == "node":
                        done = on_node.get(label_key(name)) == READY_VALUE
                    else:
                        done = len(client.node().gpus) == 8 and driver_ready(metrics_port)
                    if done:
                        t[event] = time.monotonic() - start
                time.sleep(0.02)
        finally:
            client.close()
    finally:
        agent.terminate()
        agent.wait(60)
    return t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-mib", type=int, default=200, help="model size (4 shards)")
    parser.add_argument("--image-mib", type=int, default=32, help="image layer size")
    parser.add_argument("--rate-mib", type=float, default=50, help="the link's pace, MiB/s")
    parser.add_argument("--driver-absent-s", type=float, default=20)
    parser.add_argument("--pod-runs", type=int, default=3, help="pod starts of each kind")
    args = parser.parse_args()
    if missing := [t for t in TOOLS if shutil.which(t) is None]:
        raise SystemExit(f"needs {', '.join(missing)}")
    if os.geteuid() != 0:
        raise SystemExit("containerd and the mount namespace need root")
    args.load_before = os.getloadavg()
    link = Link(args.rate_mib * MIB)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        for d in ("cluster", "origin", "agent", "tls", "sa"):
            (work / d).mkdir()
        cert, key = make_tls_cert(work / "tls")
        shutil.copy(cert, work / "sa" / "ca.crt")
        (work / "sa" / "token").write_text("bench-token\n")
        api = FakeKubeApi(token_path=work / "sa" / "token")
        api.nodes[NODE] = {"kubernetes.io/hostname": NODE}
        api_server, api_url = api.serve(cert, key)
        files = model_files(args.model_mib * MIB)
        digests = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
        try:
            with (
                cri.registry_and_containerd(work / "cluster") as cluster,
                Origin(work / "origin") as origin,
                through(link, int(cluster.registry.rsplit(":", 1)[1])) as registry_port,
                through(link, origin.port) as origin_port,
            ):
                registry = plain_http_registry(work / "cluster" / "certs.d", registry_port)
                refs = {
                    k: cri.push_image(
                        work / f"img-{k}",
                        cluster.registry,
                        "bench/server",
                        k,
                        os.urandom(args.image_mib * MIB),
                    ).replace(cluster.registry, registry)
                    for k in ("warm", *(f"cold{i}" for i in range(args.pod_runs)))
                }
                _, commit = hub.publish(origin, "bench/llm", files)
                endpoint = f"http://127.0.0.1:{origin_port}"
                del files
                root = work / "agent"
                config, manifest = _agent_inputs(work, cluster.socket, refs["warm"], endpoint)
                t = timeline(
                    root,
                    config,
                    manifest,
                    api,
                    work / "sa",
                    int(api_url.rsplit(":", 1)[1]),
                    args.driver_absent_s,
                )

                puller = CriPuller(cluster.socket)
                warm = [
                    warm_pod(puller, refs["warm"], root / "cache" / "by-name" / MODEL, digests)
                    for _ in range(args.pod_runs)
                ]
                source = f"{endpoint}/bench/llm/resolve/{commit}"
                cold = [
                    cold_pod(puller, refs[f"cold{i}"], source, work / f"cold{i}", digests)
                    for i in range(args.pod_runs)
                ]
        finally:
            api.close()
            api_server.shutdown()
            api_server.server_close()
    report(args, t, warm, cold)


def _agent_inputs(
    work: Path, containerd_socket: Path, image: str, endpoint: str
) -> tuple[Path, Path]:
    """The agent's config (on the cluster's containerd) and the prewarm manifest: the warm
    image and the model."""
    config = agent_config(work / "agent", node_name=NODE)
    settings = yaml.safe_load(config.read_text())
    settings["prewarm"]["containerd_socket"] = str(containerd_socket)
    config.write_text(yaml.safe_dump(settings))
    manifest = work / "prewarm.yaml"
    items = [
        {"image": image, "name": IMAGE},
        {"model": "bench/llm", "endpoint": endpoint, "name": MODEL},
    ]
    manifest.write_text(yaml.safe_dump({"version": 1, "items": items}))
    return config, manifest


def report(
    args: argparse.Namespace,
    t: dict[str, float],
    warm_runs: list[tuple[float, float]],
    cold_runs: list[tuple[float, float]],
) -> None:
    """``warm_runs``, ``cold_runs``: (image present s, whole pod start s) per run; medians."""
    warm_image = statistics.median(r[0] for r in warm_runs)
    warm = statistics.median(r[1] for r in warm_runs)
    cold_image = statistics.median(r[0] for r in cold_runs)
    cold = statistics.median(r[1] for r in cold_runs)
    ready = [v for k, v in t.items() if "computes" in k]
    load = args.load_before
    labels = [v for k, v in t.items() if k.startswith("Node label")]
    driver = next(v for k, v in t.items() if k.startswith("driver attached"))
    print(
        f"Command: `.venv/bin/python bench/cold_start.py --model-mib {args.model_mib} "
        f"--image-mib {args.image_mib} --rate-mib {args.rate_mib:g} "
        f"--driver-absent-s {args.driver_absent_s:g} --pod-runs {args.pod_runs}` "
        f"({os.cpu_count()} CPUs, one link of "
        f"{args.rate_mib:g} MiB/s to the registry and the origin, load average "
        f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after)\n"
    )
    print("| event | s from agent start |")
    print("|---|---:|")
    for event, seconds in sorted(t.items(), key=lambda kv: kv[1]):
        print(f"| {event} | {seconds:.2f} |")
    print()
    print(f"Pod start, medians of {args.pod_runs}:\n")
    print("| pod start | image in containerd s | + model opened, sha256 checked s |")
    print("|---|---:|---:|")
    print(f"| cold: CRI PullImage, curl --parallel over the link | {cold_image:.3f} | {cold:.3f} |")
    print(f"| warm: after prewarm (ImageStatus, by-name files) | {warm_image:.3f} | {warm:.3f} |")
    print(f"| warm vs cold | | 1/{cold / warm:.0f} |")
    result = {
        "bench": "cold_start",
        "model_mib": args.model_mib,
        "image_mib": args.image_mib,
        "rate_mib": args.rate_mib,
        "driver_absent_s": args.driver_absent_s,
        "timeline_s": {k: round(v, 3) for k, v in t.items()},
        "load_average_before": round(load[0], 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "pod_runs": args.pod_runs,
        "pod_start_cold_s": round(cold, 3),
        "pod_start_warm_s": round(warm, 3),
        "image_cold_s": round(cold_image, 3),
        "image_warm_s": round(warm_image, 3),
        "warm_over_cold": round(warm / cold, 4),
        "goal_warm_le_1_20": warm <= cold / 20,
        "goal_prewarm_before_driver": max(ready) < driver,
        "node_labels_before_driver": max(labels) < driver,
    }
    print()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
