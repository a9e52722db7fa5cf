"""A model is one item: a Hugging Face style repo snapshot, listed and fetched from a real
origin on loopback, laid out as the directory vLLM loads, labelled and budgeted as one."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.errors import Busy, Conflict, InvalidSpec
from agent.prewarm.labels import node_labels
from agent.prewarm.model import GroupRequest, ItemKind, ItemState
from agent.prewarm.naming import label_key
from tests.integration.prewarm_fixtures import cli, hub
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

pytestmark = pytest.mark.integration
KIB = 1024
REPO = "org-a/Tiny-Llama"


def snapshot(shards: int = 8, shard_size: int = 256 * KIB) -> dict[str, bytes]:
    files = {
        "config.json": b'{"model_type": "llama"}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "original/params.json": b'{"dim": 64}',
        "README.md": b"# tiny",
    }
    for i in range(1, shards + 1):
        data = hashlib.sha256(f"shard{i}".encode()).digest() * (shard_size // 32)
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = data
    return files


def test_a_model_is_one_item_laid_out_as_the_model_directory(
    tmp_path: Path, origin: Origin
) -> None:
    files = snapshot()
    endpoint, commit = hub.publish(origin, REPO, files)
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.READY, item.error
    assert (item.kind, item.name, item.size) == (
        ItemKind.GROUP,
        "Tiny-Llama",
        sum(len(d) for d in files.values()),
    )
    assert item.options["commit"] == commit
    model_dir = svc.store.name_path("Tiny-Llama")
    found = {
        str(p.relative_to(model_dir)): p.read_bytes()
        for p in model_dir.rglob("*")
        if not p.is_dir()
    }
    assert found == files
    for path in files:
        target = Path(os.path.realpath(model_dir / path))
        assert target.parent == svc.store.blob_dir and os.readlink(model_dir / path)[0] != "/"
    assert node_labels(svc.items()) == {label_key("Tiny-Llama"): "ready"}
    assert svc.store.usage().used_bytes == item.size
    assert {r.path.split("/resolve/")[-1] for r in origin.requests if "/resolve/" in r.path} == {
        f"{commit}/{p}" for p in files
    }
    again = svc.submit(GroupRequest(REPO, endpoint=endpoint))
    assert (again.id, again.state, again.hits) == (item.id, ItemState.READY, 1)


def test_include_globs_pick_the_files(tmp_path: Path, origin: Origin) -> None:
    """Globs match the whole path, and * crosses '/' (fnmatch), as huggingface-cli's do."""
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=2))
    svc = make_service(tmp_path)
    request = GroupRequest(REPO, endpoint=endpoint, include=("*.json", "*.safetensors"))
    item = svc.run(svc.submit(request).id)
    assert item.state is ItemState.READY, item.error
    assert sorted(p for p, _, _ in item.members) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "original/params.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert not (svc.store.name_path(item.name) / "README.md").exists()


def test_a_shard_that_does_not_match_its_lfs_sha256_fails_the_model(
    tmp_path: Path, origin: Origin
) -> None:
    files = snapshot(shards=2)
    endpoint, commit = hub.publish(origin, REPO, files)
    shard = origin.root / REPO / "resolve" / commit / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"x" * shard.stat().st_size)  # same size, other bytes
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.FAILED, item.error
    assert "sha256 mismatch for model-00002-of-00002.safetensors:" in (item.error or "")
    assert not svc.store.name_path(item.name).exists()
    assert list(svc.store.partial_dir.iterdir()) == []


def test_a_file_shorter_than_its_listed_size_fails_the_model_not_ready(
    tmp_path: Path, origin: Origin
) -> None:
    """A file without an LFS sha256 (config.json) is checked by its listed size alone. Sent
    chunked (no Content-Length to compare at the start), a body shorter than the listing
    said was committed and the model turned ready, labelled, with the listing's total as its
    size; the very next request found it "not what its row claims" and fetched it again. The
    file must end at its listed size, else the model fails naming the file."""
    files = snapshot(shards=1)
    endpoint, commit = hub.publish(origin, REPO, files)
    listing = hub.listing_path(origin, REPO)
    data = json.loads(listing.read_text())
    for sibling in data["siblings"]:
        if sibling["rfilename"] == "config.json":
            sibling["size"] += 10
    listing.write_text(json.dumps(data))
    origin.faults.chunked.add(f"/{REPO}/resolve/{commit}/config.json")
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint, name="m")).id)
    assert item.state is ItemState.FAILED, (item.state, item.size)
    short = len(files["config.json"])
    assert f"config.json: the origin sent {short} bytes" in (item.error or ""), item.error
    assert label_key("m") not in node_labels(svc.items())
    assert not svc.store.name_path("m").exists()
    assert list(svc.store.partial_dir.iterdir()) == []


def test_a_model_larger_than_the_budget_is_refused_before_any_file(
    tmp_path: Path, origin: Origin
) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=4))
    svc = make_service(tmp_path, budget=512 * KIB)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.FAILED and "capacity" in (item.error or "")
    assert not [r for r in origin.requests if "/resolve/" in r.path]


def test_a_listing_cut_short_once_is_fetched_again(tmp_path: Path, origin: Origin) -> None:
    """The listing's fetch retries a dropped connection as a file's does: a retry there said
    its progress to a callback that took no retry note, and the model failed "internal
    error: TypeError"."""
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=2))
    origin.faults.drop_after[f"/api/models/{REPO}/revision/main"] = 10
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.READY, item.error
    listed = [r for r in origin.requests if r.path.startswith(f"/api/models/{REPO}/")]
    assert len(listed) == 2  # cut, then whole


def test_a_failed_shard_is_retried_alone_from_its_partial(tmp_path: Path, origin: Origin) -> None:
    files = snapshot(shards=4)
    endpoint, commit = hub.publish(origin, REPO, files)
    shard = "model-00003-of-00004.safetensors"
    origin.faults.drop_after[f"/{REPO}/resolve/{commit}/{shard}"] = 100 * KIB
    svc = make_service(tmp_path, retries=0)
    failed = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert failed.state is ItemState.FAILED and failed.retry_at is not None
    before = len(origin.requests)

    svc.index.update(failed.id, state=ItemState.QUEUED)  # what schedule_pending does when due
    done = svc.run(failed.id)
    assert done.state is ItemState.READY, done.error
    fetched = [r for r in origin.requests[before:] if "/resolve/" in r.path]
    full = [r for r in fetched if "Range" not in r.headers]
    assert full == []  # nothing from zero: every file resumed or was already complete
    resumed = [r for r in fetched if r.path.endswith(shard)]
    assert [r.headers["Range"] for r in resumed] == [f"bytes={100 * KIB}-"]


_MMAP = """
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
f.close()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_model_with_a_mapped_shard_is_not_evicted(tmp_path: Path, origin: Origin) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=2))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    shard = svc.store.name_path(item.name) / "model-00001-of-00002.safetensors"
    reader = subprocess.Popen(
        [sys.executable, "-c", _MMAP, str(shard)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
        with pytest.raises(Busy, match=str(reader.pid)):
            svc.evict(item.name)
    finally:
        reader.communicate("")
    evicted = svc.evict(item.name)
    assert evicted.state is ItemState.EVICTED
    assert not svc.store.name_path(item.name).exists()
    assert list(svc.store.blob_dir.iterdir()) == [] and list(svc.store.tree_dir.iterdir()) == []


def test_audit_evicts_a_model_missing_a_shard(tmp_path: Path, origin: Origin) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=2))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    _, sha, _ = next(m for m in item.members if m[0].endswith(".safetensors"))
    svc.store.blob_path(sha).unlink()
    [changed] = svc.audit()
    assert changed.state is ItemState.EVICTED and "missing" in (changed.error or "")
    assert node_labels(svc.items()) == {}
    again = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert again.state is ItemState.READY and svc.store.blob_path(sha).exists()


def test_two_models_share_identical_files_and_evicting_one_keeps_the_other(
    tmp_path: Path, origin: Origin
) -> None:
    files = snapshot(shards=2)
    endpoint, _ = hub.publish(origin, REPO, files)
    hub.publish(origin, "org-b/Tiny-Llama", files)  # a fork: same bytes, default name taken
    svc = make_service(tmp_path)
    a = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    b = svc.run(svc.submit(GroupRequest("org-b/Tiny-Llama", endpoint=endpoint)).id)
    assert b.state is ItemState.READY and b.name != a.name
    assert svc.store.usage().used_bytes == a.size  # one copy of the bytes
    svc.evict(a.name)
    model_b = svc.store.name_path(b.name)
    assert (model_b / "config.json").read_bytes() == files["config.json"]
    assert svc.audit() == []


def test_unsafe_paths_in_a_listing_fail_the_model(tmp_path: Path, origin: Origin) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=1))
    listing = hub.listing_path(origin, REPO)
    data = json.loads(listing.read_text())
    data["siblings"].append({"rfilename": "../../etc/cron.d/x", "size": 1})
    listing.write_text(json.dumps(data))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.FAILED and "unsafe" in (item.error or "")
    assert not (tmp_path / "etc").exists()


def test_a_listing_with_a_file_that_is_also_a_directory_fails_before_any_fetch(
    tmp_path: Path, origin: Origin
) -> None:
    """`config.json` and `config.json/x` cannot both be laid out: every file was fetched, then
    the model failed as "internal error: FileExistsError(17, 'File exists')"."""
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=1))
    listing = hub.listing_path(origin, REPO)
    data = json.loads(listing.read_text())
    data["siblings"].append({"rfilename": "config.json/x", "size": 1})
    listing.write_text(json.dumps(data))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.FAILED and item.retry_at is None
    assert "config.json is both a file and a directory" in (item.error or ""), item.error
    assert [r.path for r in origin.requests if "/resolve/" in r.path] == []


def _hostile_listing(origin: Origin, siblings: list[dict[str, object]]) -> str:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=1))
    listing = hub.listing_path(origin, REPO)
    data = json.loads(listing.read_text())
    data["siblings"] = siblings
    listing.write_text(json.dumps(data))
    return endpoint


@pytest.mark.parametrize(
    ("depth", "said"),
    [
        # ~1000-character paths of 500 components: refused at the first, naming it
        (500, "siblings[0].rfilename has more than 64 path components"),
        # within the component bound: refused by the count, at the first file past it
        (60, "lists more than 10000 files"),
    ],
)
def test_a_hostile_listing_of_deep_paths_is_refused_fast_naming_the_field(
    tmp_path: Path, origin: Origin, depth: int, said: str
) -> None:
    """15,000 siblings of ~500-component paths (a listing under the 16 MiB bound) cost 21 s of
    CPU, every parent directory of every path built, before the file count was refused."""
    deep = "/".join(["d"] * (depth - 1))
    siblings: list[dict[str, object]] = [
        {"rfilename": f"{deep}/{i}", "size": 1} for i in range(15_000)
    ]
    endpoint = _hostile_listing(origin, siblings)
    svc = make_service(tmp_path)
    item_id = svc.submit(GroupRequest(REPO, endpoint=endpoint)).id
    started = time.monotonic()
    item = svc.run(item_id)
    took = time.monotonic() - started
    assert item.state is ItemState.FAILED and said in (item.error or ""), item.error
    assert [r.path for r in origin.requests if "/resolve/" in r.path] == []
    assert took < 5.0  # fetching and reading 16 MiB of JSON; the refusal itself costs little


def test_a_file_that_is_also_a_directory_is_found_wherever_it_sorts(
    tmp_path: Path, origin: Origin
) -> None:
    """``a`` and ``a/x`` with ``a-b`` and ``a.c`` between them in plain path order."""
    siblings: list[dict[str, object]] = [
        {"rfilename": p, "size": 1} for p in ("a/x", "a-b", "a.c", "a", "b/c/d", "b/c/e")
    ]
    endpoint = _hostile_listing(origin, siblings)
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(GroupRequest(REPO, endpoint=endpoint)).id)
    assert item.state is ItemState.FAILED, item.error
    assert "a is both a file and a directory" in (item.error or ""), item.error


def test_cli_prewarm_model(tmp_path: Path, origin: Origin) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=2))
    env = cli.agent_env(tmp_path)
    args = ["prewarm", "model", REPO, "--endpoint", endpoint, "--name", "tiny", "-o", "json"]
    done = cli.run(args, env)
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)
    assert (record["kind"], record["state"]) == ("group", "ready")
    assert (tmp_path / "cache" / "by-name" / "tiny" / "config.json").exists()


def test_other_include_globs_are_another_source(tmp_path: Path, origin: Origin) -> None:
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=1))
    svc = make_service(tmp_path)
    svc.submit(GroupRequest(REPO, endpoint=endpoint, include=("*.json",), name="m"))
    with pytest.raises(Conflict, match="another source"):
        svc.submit(GroupRequest(REPO, endpoint=endpoint, include=("*",), name="m"))
    assert len(svc.items()) == 1


@pytest.mark.parametrize("tail", ["?mirror=1", "#main", "?"])
def test_an_endpoint_with_a_query_or_fragment_is_refused_naming_it(
    tmp_path: Path, origin: Origin, tail: str
) -> None:
    """The listing and file paths are appended to the endpoint: after a query or fragment they
    would land in it, and the listing was asked of another URL than the one named."""
    endpoint, _ = hub.publish(origin, REPO, snapshot(shards=1))
    svc = make_service(tmp_path)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(GroupRequest(REPO, endpoint=endpoint + tail))
    assert [v.field for v in bad.value.violations] == ["endpoint"]
    assert svc.items() == [] and origin.requests == []
