"""A model of 8 shards: `prewarm model` (parallel, verified, one item) vs curl in a loop.

    .venv/bin/python bench/prewarm_group.py [--shard-mib 128] [--shards 8] [--runs 3]
                                            [--rate-mib 0]

Publishes a Hugging Face style snapshot (8 safetensors shards, config and tokenizer files) on a
local origin (a real socket), then per run: curl fetching the files one after another (what a
shell loop over the file list does), the same followed by sha256sum of the shards, and
`PrewarmService` warming the group (listing, 8 parallel fetches, sha256 of every shard checked
against the listing, fsync, rename, model directory). ``--rate-mib`` throttles each connection
(MiB/s), as a CDN's per-stream limit does; 0 serves at loopback speed.
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

from agent.prewarm.model import GroupRequest, ItemState
from tests.integration.prewarm_fixtures import hub
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

MIB = 1024 * 1024
REPO = "bench/Model-8"


def snapshot(shards: int, shard_size: int) -> dict[str, bytes]:
    block = os.urandom(shard_size)
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}"}
    for i in range(1, shards + 1):
        # Distinct shards (one byte differs) without paying for urandom per shard.
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = bytes([i]) + block[1:]
    return files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate-mib", type=int, default=0)
    args = parser.parse_args()
    curl = shutil.which("curl")
    if curl is None:
        raise SystemExit("curl is needed for the baseline")
    files = snapshot(args.shards, args.shard_mib * MIB)
    total = sum(len(d) for d in files.values())
    results: dict[str, list[float]] = {"curl loop": [], "curl loop + sha256sum": [], "prewarm": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        (work / "origin").mkdir()
        with Origin(work / "origin") as origin:
            endpoint, commit = hub.publish(origin, REPO, files)
            if args.rate_mib:
                for path in files:
                    origin.faults.rate_bps[f"/{REPO}/resolve/{commit}/{path}"] = args.rate_mib * MIB
            urls = [f"{endpoint}/{REPO}/resolve/{commit}/{p}" for p in sorted(files)]
            for run in range(args.runs):
                out = work / f"curl-{run}"
                out.mkdir()
                start = time.perf_counter()
                for i, url in enumerate(urls):
                    subprocess.run([curl, "-sS", "-o", str(out / str(i)), url], check=True)
                t_curl = time.perf_counter() - start
                start = time.perf_counter()
                subprocess.run(
                    ["sha256sum", *map(str, out.iterdir())], check=True, capture_output=True
                )
                t_sum = time.perf_counter() - start
                shutil.rmtree(out)
                results["curl loop"].append(t_curl)
                results["curl loop + sha256sum"].append(t_curl + t_sum)
                state = work / f"prewarm-{run}"
                svc = make_service(state, budget=4 * total)
                item = svc.submit(GroupRequest(REPO, endpoint=endpoint, name="model"))
                start = time.perf_counter()
                done = svc.run(item.id)
                results["prewarm"].append(time.perf_counter() - start)
                if done.state is not ItemState.READY:
                    raise SystemExit(f"prewarm failed: {done.error}")
                svc.index.close()
                shutil.rmtree(state)
    base = statistics.median(results["curl loop"])
    rate = f", each connection throttled to {args.rate_mib} MiB/s" if args.rate_mib else ""
    print(
        f"Command: `.venv/bin/python bench/prewarm_group.py --shard-mib {args.shard_mib} "
        f"--shards {args.shards} --runs {args.runs} --rate-mib {args.rate_mib}` "
        f"({os.cpu_count()} CPUs, origin on 127.0.0.1{rate}; {total / MIB:.0f} MiB in "
        f"{len(files)} files)\n"
    )
    print("| tool | median s | MiB/s | vs curl loop |")
    print("|---|---:|---:|---:|")
    for tool, times in results.items():
        med = statistics.median(times)
        print(f"| {tool} | {med:.2f} | {total / MIB / med:.0f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
