"""Image pull time through CRI: cold, vs the pod's pull after the agent prewarmed the image.

    .venv/bin/python bench/image_pull.py [--size-mib 256] [--runs 3]

Starts a real containerd (CRI plugin, native snapshotter) and a local docker-registry (the test
fixtures), pushes a fresh one-layer image of random bytes per run (so every cold pull is cold),
and times, per run:

- ctr pull (cold): containerd's own client, the peer;
- CRI PullImage (cold): what the kubelet does when the image is not on the node;
- prewarm: `PrewarmService` pulling the same kind of image ahead of the pod;
- pod pull after prewarm, IfNotPresent: the kubelet's ImageStatus check, then no pull;
- pod pull after prewarm, Always: CRI PullImage of an image already on the node.

Needs root and Debian containerd, docker-registry, skopeo, umoci.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.prewarm.images import CriPuller
from agent.prewarm.model import ImageRequest, ItemState
from tests.integration.prewarm_fixtures import cri
from tests.integration.prewarm_fixtures.agent import make_service

MIB = 1024 * 1024


def ctr_pull(cluster: cri.Cluster, work: Path, ref: str) -> None:
    subprocess.run(
        [
            "ctr",
            "--address",
            str(cluster.socket),
            "-n",
            "k8s.io",
            "images",
            "pull",
            "--plain-http",
            "--snapshotter",
            "native",
            "--hosts-dir",
            str(work / "certs.d"),
            ref,
        ],
        check=True,
        capture_output=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if missing := cri.missing_tools():
        raise SystemExit(f"needs Debian {', '.join(missing)}")
    if os.geteuid() != 0:
        raise SystemExit("containerd needs root")
    rows: dict[str, list[float]] = {
        "ctr pull (cold), containerd's client": [],
        "CRI PullImage (cold), the kubelet without prewarm": [],
        "prewarm (CRI pull ahead of the pod)": [],
        "pod pull after prewarm, IfNotPresent (ImageStatus)": [],
        "pod pull after prewarm, Always (PullImage, warm)": [],
    }
    size = args.size_mib * MIB
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        (work / "cluster").mkdir()
        with cri.registry_and_containerd(work / "cluster") as cluster:
            puller = CriPuller(cluster.socket)
            for run in range(args.runs):
                refs = [
                    cri.push_image(
                        work / f"img-{run}-{k}",
                        cluster.registry,
                        "bench/model",
                        f"r{run}{k}",
                        os.urandom(size),
                    )
                    for k in ("ctr", "cri", "pre")
                ]
                ctr_ref, cri_ref, pre_ref = refs
                start = time.perf_counter()
                ctr_pull(cluster, work / "cluster", ctr_ref)
                rows["ctr pull (cold), containerd's client"].append(time.perf_counter() - start)
                cold = puller.pull(cri_ref, None)
                assert cold.cold, "the CRI pull was meant to be cold"
                rows["CRI PullImage (cold), the kubelet without prewarm"].append(cold.seconds)
                state = work / f"agent-{run}"
                svc = make_service(state)
                svc._puller = puller
                item = svc.submit(ImageRequest(pre_ref, name=f"model-{run}"))
                start = time.perf_counter()
                svc.run(item.id)
                t_pre = time.perf_counter() - start
                if svc.get(item.id).state is not ItemState.READY:
                    raise SystemExit(f"prewarm failed: {svc.get(item.id).error}")
                rows["prewarm (CRI pull ahead of the pod)"].append(t_pre)
                start = time.perf_counter()
                assert puller.status(pre_ref).id, "the prewarmed image is not on the node"
                rows["pod pull after prewarm, IfNotPresent (ImageStatus)"].append(
                    time.perf_counter() - start
                )
                warm = puller.pull(pre_ref, None)
                assert not warm.cold
                rows["pod pull after prewarm, Always (PullImage, warm)"].append(warm.seconds)
                svc.index.close()
                shutil.rmtree(state)
                for ref in refs:
                    puller.remove(ref)
    cold_median = statistics.median(rows["CRI PullImage (cold), the kubelet without prewarm"])
    print(
        f"Command: `.venv/bin/python bench/image_pull.py --size-mib {args.size_mib} "
        f"--runs {args.runs}` ({os.cpu_count()} CPUs, registry on 127.0.0.1, "
        "native snapshotter)\n"
    )
    print("| pull | median s | vs cold CRI pull |")
    print("|---|---:|---:|")
    for name, times in rows.items():
        med = statistics.median(times)
        print(
            f"| {name} | {med:.3f} | {cold_median / med:.0f}x faster |"
            if med < cold_median
            else f"| {name} | {med:.3f} | {med / cold_median:.2f}x the time |"
        )


if __name__ == "__main__":
    main()
