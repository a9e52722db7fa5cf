"""Prewarm file throughput vs curl + sha256sum, same file, same local origin, same run.

    .venv/bin/python bench/prewarm_throughput.py [--size-mib 2048] [--runs 3] [--rate-mib N]

Serves a file from a local HTTP origin (a real socket, sendfile), then per run:
curl -o (download only), sha256sum of curl's file, and `PrewarmService` (download + sha256
verified against the expected digest + fsync + atomic rename). Prints a markdown table; the goal
is prewarm >= 0.9x curl's throughput. Caches are dropped between tools only by using fresh files.

curl leaves its bytes in the page cache; the prewarm fsyncs before the rename so a final path
never holds bytes a power loss could lose. The "curl, then fsync" row times the same durability
for curl's file, so the table shows where the disk, not the code, sets the limit.
``--rate-mib`` paces the origin (MiB/s) as a network link would; 0, the default, is loopback
with sendfile, faster than most disks can write back.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.prewarm.model import FileRequest, ItemState
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

MIB = 1024 * 1024


def make_file(path: Path, size: int) -> str:
    block = os.urandom(64 * MIB)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = block[: min(left, len(block))]
            f.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate-mib", type=int, default=0, help="origin pace; 0: unpaced")
    args = parser.parse_args()
    size = args.size_mib * MIB
    curl = shutil.which("curl")
    if curl is None:
        raise SystemExit("curl is needed for the baseline")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        (work / "origin").mkdir()
        digest = make_file(work / "origin" / "model.bin", size)
        results: dict[str, list[float]] = {
            "curl": [],
            "sha256sum": [],
            "curl+sha256sum": [],
            "curl, then fsync": [],
            "prewarm": [],
        }
        with Origin(work / "origin") as origin:
            url = origin.url("model.bin")
            if args.rate_mib:
                origin.faults.rate_bps["/model.bin"] = args.rate_mib * MIB
            for run in range(args.runs):
                out = work / f"curl-{run}.bin"
                t_curl = timed(
                    lambda out=out: subprocess.run([curl, "-sS", "-o", str(out), url], check=True)
                )
                t_sum = timed(
                    lambda out=out: subprocess.run(
                        ["sha256sum", str(out)], check=True, capture_output=True
                    )
                )
                t_sync = timed(lambda out=out: _fsync(out))
                out.unlink()
                results["curl, then fsync"].append(t_curl + t_sync)
                results["curl"].append(t_curl)
                results["sha256sum"].append(t_sum)
                results["curl+sha256sum"].append(t_curl + t_sum)
                state = work / f"prewarm-{run}"
                svc = make_service(state, budget=4 * size)
                item = svc.submit(FileRequest(url, name="model", sha256=digest))
                t_pre = timed(lambda svc=svc, item=item: svc.run(item.id))
                final = svc.get(item.id)
                if final.state is not ItemState.READY:
                    raise SystemExit(f"prewarm failed: {final.error}")
                results["prewarm"].append(t_pre)
                svc.index.close()
                shutil.rmtree(state)
    base = statistics.median(results["curl"])
    print(
        f"Command: `.venv/bin/python bench/prewarm_throughput.py --size-mib {args.size_mib} "
        f"--runs {args.runs} --rate-mib {args.rate_mib}` ({os.cpu_count()} CPUs, origin on "
        f"127.0.0.1, {f'paced at {args.rate_mib} MiB/s' if args.rate_mib else 'unpaced'})\n"
    )
    print("| tool | median s | MiB/s | vs curl |")
    print("|---|---:|---:|---:|")
    for tool, times in results.items():
        med = statistics.median(times)
        rate = size / MIB / med
        print(f"| {tool} | {med:.2f} | {rate:.0f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
