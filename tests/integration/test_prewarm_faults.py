"""Fault tests with real processes: SIGKILL mid-download, a full disk, and the CLI surface."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.prewarm.model import FileRequest, ItemState
from tests.integration.prewarm_fixtures import cli
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


def data(n: int) -> bytes:
    return (hashlib.sha256(b"fault").digest() * (n // 32 + 1))[:n]


def test_sigkilled_cli_resumes_from_its_partial_not_from_zero(
    tmp_path: Path, origin: Origin
) -> None:
    """kill -9 mid-download; the next run takes the item over and asks only for the rest."""
    digest = origin.add("model.bin", data(6 * MIB))
    origin.faults.rate_bps["/model.bin"] = 2 * MIB
    env = cli.agent_env(tmp_path)
    args = ["prewarm", "file", origin.url("model.bin"), "--name", "model", "--sha256", digest]
    proc = cli.spawn(args, env)
    partial_dir = tmp_path / "cache" / "partial"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parts = list(partial_dir.glob("*.part")) if partial_dir.exists() else []
        if parts and parts[0].stat().st_size >= MIB:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    on_disk = parts[0].stat().st_size
    assert MIB <= on_disk < 6 * MIB
    assert not (tmp_path / "cache" / "by-name" / "model").exists()

    origin.faults.rate_bps.clear()
    done = cli.run([*args, "-o", "json"], env)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)
    assert (item["state"], item["sha256"]) == ("ready", digest)
    first, resumed = origin.ranges("model.bin")
    assert first is None
    start = int(resumed.removeprefix("bytes=").rstrip("-"))
    assert start >= on_disk  # bytes written after our size check are kept too
    blob = tmp_path / "cache" / "blobs" / "sha256" / digest
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=False)
    if res.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_mid_write_fails_cleanly_and_the_cache_stays_usable(
    tmp_path: Path, origin: Origin, tmpfs: Path
) -> None:
    """Another tenant fills the volume; a chunked (size unknown) fetch hits ENOSPC."""
    (tmpfs / "other-tenant").write_bytes(b"\0" * 5 * MIB)
    origin.add("big.bin", data(4 * MIB))
    origin.faults.chunked.add("/big.bin")
    svc = make_service(tmp_path, cache_dir=tmpfs / "cache", budget=1 << 40)
    item = svc.run(svc.submit(FileRequest(origin.url("big.bin"))).id)
    assert item.state is ItemState.FAILED
    assert "volume full" in (item.error or "")
    assert list(svc.store.partial_dir.iterdir()) == []
    assert list(svc.store.blob_dir.iterdir()) == []

    small = origin.add("small.bin", data(MIB))
    ok = svc.run(svc.submit(FileRequest(origin.url("small.bin"))).id)
    assert (ok.state, ok.sha256) == (ItemState.READY, small)


def test_known_size_beyond_free_space_is_refused_before_fetching(
    tmp_path: Path, origin: Origin, tmpfs: Path
) -> None:
    (tmpfs / "other-tenant").write_bytes(b"\0" * 5 * MIB)
    origin.add("big.bin", data(4 * MIB))
    svc = make_service(tmp_path, cache_dir=tmpfs / "cache", budget=1 << 40)
    item = svc.run(svc.submit(FileRequest(origin.url("big.bin"))).id)
    assert item.state is ItemState.FAILED
    assert "free" in (item.error or "") and item.fetched_bytes == 0


def test_cli_list_pin_evict_and_cancel(tmp_path: Path, origin: Origin) -> None:
    origin.add("a.bin", data(MIB))
    env = cli.agent_env(tmp_path)
    assert cli.run(["prewarm", "file", origin.url("a.bin"), "--name", "a"], env).returncode == 0
    listed = json.loads(cli.run(["prewarm", "list", "-o", "json"], env).stdout)
    assert [(i["name"], i["state"]) for i in listed] == [("a", "ready")]
    assert cli.run(["cache", "pin", "a"], env).returncode == 0
    refused = cli.run(["cache", "evict", "a"], env)
    assert refused.returncode != 0 and "pinned" in refused.stderr
    assert cli.run(["cache", "pin", "a", "--unpin"], env).returncode == 0
    assert cli.run(["cache", "evict", "a"], env).returncode == 0
    usage = json.loads(cli.run(["cache", "list", "-o", "json"], env).stdout)
    assert usage["usage"]["used_bytes"] == 0

    # --no-wait hands the item to the agent: here none runs, so each later command's embedded
    # agent works on it while it lives (a slow origin keeps it unfinished) until cancelled.
    origin.add("slow.bin", data(8 * MIB))
    origin.faults.rate_bps["/slow.bin"] = 64 * 1024
    queued = cli.run(["prewarm", "file", origin.url("slow.bin"), "--name", "b", "--no-wait"], env)
    assert queued.returncode == 0, queued.stderr
    listed = json.loads(cli.run(["prewarm", "list", "-o", "json"], env).stdout)
    assert listed[1]["name"] == "b" and listed[1]["state"] in ("queued", "fetching")
    cancelled = cli.run(["prewarm", "cancel", "b"], env)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout


def test_cli_refuses_metadata_urls_and_escaping_names_with_one_line(tmp_path: Path) -> None:
    env = cli.agent_env(tmp_path)
    meta = cli.run(["prewarm", "file", "http://169.254.169.254/latest/meta-data/"], env)
    assert meta.returncode == 8 and "denied" in meta.stderr
    name = cli.run(["prewarm", "file", "https://example.com/x", "--name", "../x"], env)
    assert name.returncode == 2 and "not a valid item name" in name.stderr
    scheme = cli.run(["prewarm", "file", "file:///etc/passwd"], env)
    assert scheme.returncode == 2 and "scheme 'file'" in scheme.stderr


def test_a_cache_dir_that_cannot_be_made_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """A file where the cache directory should be used to crash every command, `status` and
    `doctor` included, with a traceback."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"x")
    env = cli.agent_env(tmp_path, cache_dir=str(blocker))
    for args in (["cache", "list"], ["prewarm", "list", "-o", "json"]):
        done = cli.run(args, env)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert f"prewarm.cache_dir {blocker}" in done.stderr and done.stdout == ""
    assert blocker.read_bytes() == b"x"


def test_a_run_that_raises_fails_the_item_instead_of_leaving_it_fetching(
    tmp_path: Path, origin: Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error outside the fetch's own handling (here the partial dir wiped under the agent)
    escaped the worker: the item stayed `fetching`, owned by the live agent, and the CLI that
    asked for it waited forever."""
    origin.add("a.bin", data(MIB))
    svc = make_service(tmp_path)
    item = svc.submit(FileRequest(origin.url("a.bin"), name="a"))
    gone = FileNotFoundError(2, "No such file or directory", str(svc.store.partial_dir))

    def wiped(item_id: str) -> None:
        raise gone

    monkeypatch.setattr(svc.store, "partial", wiped)
    done = svc.run(item.id)
    assert done.state is ItemState.FAILED, done
    assert "No such file or directory" in (done.error or "")
    assert done.retry_at is not None  # the agent tries it again, as after an outage


def test_a_wiped_cache_dir_is_made_again_and_its_items_fetched_again(
    tmp_path: Path, origin: Origin
) -> None:
    """`rm -rf` of the cache's host path under a serving agent: every audit, listing and fetch
    failed on the missing directories until the agent was restarted."""
    blob = data(MIB)
    origin.add("a.bin", blob)
    svc = make_service(tmp_path)
    assert svc.run(svc.submit(FileRequest(origin.url("a.bin"), name="a")).id).state is (
        ItemState.READY
    )
    shutil.rmtree(svc.store.root)
    assert [(i.name, i.state) for i in svc.audit()] == [("a", ItemState.EVICTED)]
    assert svc.store.usage().used_bytes == 0
    again = svc.run(svc.submit(FileRequest(origin.url("a.bin"), name="a")).id)
    assert again.state is ItemState.READY, again.error
    assert (svc.store.name_dir / "a").read_bytes() == blob


def test_manifest_applies_every_item(tmp_path: Path, origin: Origin) -> None:
    da = origin.add("a.bin", data(MIB))
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        f"version: 1\nitems:\n  - url: {origin.url('a.bin')}\n    name: a\n    sha256: {da}\n"
        f"  - url: {origin.url('a.bin')}\n    name: a-copy\n    pin: true\n"
    )
    env = cli.agent_env(tmp_path)
    res = cli.run(["prewarm", "apply", str(manifest), "-o", "json"], env)
    assert res.returncode == 0, res.stderr
    assert [(i["name"], i["state"]) for i in json.loads(res.stdout)] == [
        ("a", "ready"),
        ("a-copy", "ready"),
    ]


def test_a_warm_left_unfinished_with_no_agent_running_says_who_takes_it_up(
    tmp_path: Path, origin: Origin
) -> None:
    """With no agent serving the node, the command's own embedded agent stops with it. Ctrl-C
    still said 'detached from ...; the items stay with the agent', as if a fetch went on, and
    `--no-wait` said nothing while its item waited for an agent nobody ran. Both now say that
    no agent runs and that the items wait queued for the next one."""
    origin.add("slow.bin", data(8 * MIB))
    origin.faults.rate_bps["/slow.bin"] = 256 * 1024
    env = cli.agent_env(tmp_path)
    proc = cli.spawn(["prewarm", "file", origin.url("slow.bin"), "--name", "slow"], env)
    partial_dir = tmp_path / "cache" / "partial"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(partial_dir.glob("*.part")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "no agent runs on this node" in err and "stay with the agent" not in err, err
    queued = cli.run(["prewarm", "file", origin.url("m.bin"), "--name", "m", "--no-wait"], env)
    assert queued.returncode == 0, queued.stderr
    assert "no agent runs on this node: the items stay queued" in queued.stderr, queued.stderr
