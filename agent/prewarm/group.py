"""A model as one cache item: the files of a Hugging Face style repo snapshot.

The listing is the Hub's model-info API, ``GET <endpoint>/api/models/<repo>/revision/<rev>
?blobs=true``: the commit ``sha`` and ``siblings`` with ``rfilename``, ``size`` and, for LFS
files (the weights), ``lfs.sha256``. Every file is then fetched from
``<endpoint>/<repo>/resolve/<commit>/<path>``, at the commit the listing named, so all files come
from one snapshot even while ``main`` moves, and an LFS file is verified against its sha256.

Pure apart from `list_group`, which reads the listing through a fetcher into memory. The listing
comes from the network and is hostile: paths are checked (relative, no ``..``, no empty or
hidden-dir tricks, at most `MAX_PATH_PARTS` components), sizes bounded, the number of siblings
and of files capped, each refused as soon as it is seen, and a refusal names the sibling.
Nothing costs more than a pass over the listing and a sort of its files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import translate
from itertools import pairwise
from typing import Any
from urllib.parse import quote

from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm.errors import FetchFailed
from agent.prewarm.fetch_http import CancelledFn, FetchSpec, no_progress
from agent.prewarm.policy import redact_url

MAX_FILES = 10_000
#: Siblings of a listing, matched or not (each costs a path check and the include globs)
MAX_SIBLINGS = 100_000
#: Components of one file's path: real repos nest a few levels
MAX_PATH_PARTS = 64
MAX_INCLUDE = 64
MAX_GLOB = 256
#: '*' in one glob: each may backtrack over a whole path, so a caller's 127 of them in 64
#: globs cost seconds a listing (a real pattern has one or two)
MAX_STARS = 8
MAX_LISTING_BYTES = 16 * 1024 * 1024
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, slots=True)
class Member:
    """One file of a group: where it goes in the model directory, and where it comes from."""

    path: str
    url: str
    size: int
    sha256: str | None = None  # known for LFS files; others are hashed and recorded

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "url": self.url, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(str(data["path"]), str(data["url"]), int(data["size"]), data.get("sha256"))


@dataclass(frozen=True, slots=True)
class Listing:
    commit: str
    members: tuple[Member, ...]

    @property
    def total(self) -> int:
        return sum(m.size for m in self.members)


def check_repo(repo: str, revision: str) -> None:
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise InvalidSpec(
            f"model repo {repo!r} is not a repo id",
            [FieldViolation("model", "owner/name of A-Z a-z 0-9 . _ -")],
        )
    if not _REVISION.fullmatch(revision) or ".." in revision:
        raise InvalidSpec(
            f"revision {revision!r} is not a branch, tag or commit",
            [FieldViolation("revision", "e.g. main, v1.0 or a 40-hex commit")],
        )


def check_include(include: Sequence[str]) -> None:
    if len(include) > MAX_INCLUDE or any(
        not g or len(g) > MAX_GLOB or g.count("*") > MAX_STARS for g in include
    ):
        raise InvalidSpec(
            f"include takes 1 to {MAX_INCLUDE} globs of at most {MAX_GLOB} characters and "
            f"{MAX_STARS} '*' each",
            [FieldViolation("include", "globs such as *.safetensors, config.json")],
        )


def listing_url(endpoint: str, repo: str, revision: str) -> str:
    return (
        f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"
    )


def _safe_path(path: Any, where: str, repo: str) -> str:
    """``path`` when it is safe to lay out; FetchFailed naming ``where`` (the sibling) if not."""
    if not isinstance(path, str) or not path or len(path) > 1024 or "\\" in path or "\0" in path:
        raise FetchFailed(f"the listing of {repo} has an unsafe file path at {where}")
    if path.count("/") >= MAX_PATH_PARTS:
        raise FetchFailed(
            f"the listing of {repo} is refused: {where} has more than {MAX_PATH_PARTS} path "
            "components"
        )
    if path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
        raise FetchFailed(f"the listing of {repo} has an unsafe file path at {where}")
    return path


def _globs(include: Sequence[str]) -> re.Pattern[str] | None:
    """The ``include`` globs as one pattern (fnmatch's, case-sensitive): a path is matched once,
    not once per glob; None when every file is wanted."""
    if not include:
        return None
    return re.compile("|".join(f"(?:{translate(g)})" for g in include))


def _file_and_directory(paths: Iterable[str]) -> str | None:
    """A path that is a file and, by another path under it, a directory; None when none is.
    Sorted by components (``/`` as the lowest character), a path's first follower is under it
    when any is: one sort and one pass, never every parent of every path."""
    ordered = sorted(p.replace("/", "\0") for p in paths)
    for path, after in pairwise(ordered):
        if after.startswith(path + "\0"):
            return path.replace("\0", "/")
    return None


def parse_listing(data: Any, endpoint: str, repo: str, include: Sequence[str] = ()) -> Listing:
    """The snapshot's files (those matching ``include`` globs, all when empty), in path order."""
    if not isinstance(data, dict) or not isinstance(data.get("siblings"), list):
        raise FetchFailed(f"the listing of {repo} has no siblings list")
    commit = data.get("sha")
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise FetchFailed(f"the listing of {repo} names no 40-hex commit sha")
    siblings = data["siblings"]
    if len(siblings) > MAX_SIBLINGS:
        raise FetchFailed(
            f"the listing of {repo} is refused: siblings lists {len(siblings)} entries; "
            f"at most {MAX_SIBLINGS} are read"
        )
    wanted = _globs(include)
    members: dict[str, Member] = {}
    for index, sibling in enumerate(siblings):
        where = f"siblings[{index}]"
        if not isinstance(sibling, dict):
            raise FetchFailed(f"the listing of {repo} has a sibling that is not an object")
        path = _safe_path(sibling.get("rfilename"), f"{where}.rfilename", repo)
        if wanted is not None and not wanted.match(path):
            continue
        if len(members) >= MAX_FILES and path not in members:
            raise FetchFailed(
                f"{repo} lists more than {MAX_FILES} files (at {where}); at most {MAX_FILES} "
                "are warmed"
            )
        raw_lfs = sibling.get("lfs")
        lfs: dict[str, Any] = raw_lfs if isinstance(raw_lfs, dict) else {}
        size = lfs.get("size", sibling.get("size"))
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FetchFailed(f"the listing of {repo} gives no size for {path} (blobs=true)")
        sha = lfs.get("sha256")
        if sha is not None and (not isinstance(sha, str) or not _SHA256.fullmatch(sha)):
            raise FetchFailed(f"the listing of {repo} gives a bad sha256 for {path}")
        url = f"{endpoint.rstrip('/')}/{repo}/resolve/{commit}/{quote(path)}"
        members[path] = Member(path, url, size, sha)
    if not members:
        raise FetchFailed(f"no file of {repo} matches {', '.join(include) or 'the listing'}")
    # The model directory cannot hold a path as a file and as a directory: refused unfetched.
    clash = _file_and_directory(members)
    if clash is not None:
        raise FetchFailed(
            f"the listing of {repo} is unsafe: {clash} is both a file and a directory"
        )
    return Listing(commit, tuple(members[p] for p in sorted(members)))


class MemorySink:
    """Keeps a small response (a listing) in memory, bounded; satisfies `Sink`."""

    def __init__(self, limit: int = MAX_LISTING_BYTES) -> None:
        self.offset = 0
        self.limit: int | None = limit
        self.restarted: str | None = None
        self._max = limit
        self._data = bytearray()

    @property
    def validators(self) -> dict[str, Any]:
        return {}

    def save_validators(self, data: dict[str, Any]) -> None:
        return None

    def admit(self, total: int | None) -> None:
        if total is not None and total > self._max:
            raise FetchFailed(f"listing of {total} bytes passes the {self._max}-byte limit")

    def restart(self, reason: str | None = None) -> None:
        self._data.clear()
        self.offset = 0

    def write(self, data: bytes | memoryview) -> None:
        if self.offset + len(data) > self._max:
            raise FetchFailed(f"listing passes the {self._max}-byte limit")
        self._data += data
        self.offset += len(data)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        raise FetchFailed("a listing is read in order")

    def getvalue(self) -> bytes:
        return bytes(self._data)


def list_group(
    fetcher: Any,
    endpoint: str,
    repo: str,
    revision: str,
    include: Sequence[str],
    headers: dict[str, str],
    cancelled: CancelledFn,
) -> Listing:
    """Read and parse the listing through ``fetcher`` (a direct `HttpFetcher`)."""
    url = listing_url(endpoint, repo, revision)
    sink = MemorySink()
    fetcher.fetch(FetchSpec(url, headers), sink, no_progress, cancelled)
    try:
        data = json.loads(sink.getvalue())
    except ValueError:
        raise FetchFailed(f"the listing at {redact_url(url)} is not JSON") from None
    return parse_listing(data, endpoint, repo, include)
