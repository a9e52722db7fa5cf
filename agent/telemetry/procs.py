"""Which container a GPU process belongs to: ``/proc/<pid>/cgroup`` and kubelet's log links.

The cgroup path of a container process ends in its container id under every runtime and cgroup
driver (``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope``, or a bare
``<id>`` with cgroupfs). kubelet links every container's log as
``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``; pod, namespace and container names
cannot contain ``_``, so the name alone maps a container id to its pod. PodResources carries no pod
UID or container id, so this is how per-process NVML data reaches pods without the API server.
Each link points into the pod's log directory, ``/var/log/pods/<namespace>_<pod>_<uid>/``
(kubelet's ``BuildPodLogsDirectory``): reading the link (not following it) gives the pod's UID.
"""

from __future__ import annotations

import errno
import os
import re
from collections import defaultdict
from pathlib import Path

from agent.telemetry.snapshot import PodRef

__all__ = ["ContainerDirectory", "container_id", "read_container_id"]

_CONTAINER_ID = re.compile(
    r"(?:cri-containerd-|crio-|docker-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?"
)
_LOG_LINK = re.compile(r"(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<container>.+)-(?P<id>[0-9a-f]{64})\.log")
#: a log link's target directory: <namespace>_<pod>_<uid> (a pod UID is an RFC 4122 UUID)
_POD_DIR = re.compile(
    r"(?P<ns>[^_/]+)_(?P<pod>[^_/]+)_(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)


def container_id(cgroup_text: str) -> str | None:
    """The container id in a ``/proc/<pid>/cgroup`` file (v1 or v2), or None for host processes."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        m = _CONTAINER_ID.fullmatch(path.rstrip("/").rsplit("/", 1)[-1])
        if m:
            return m["id"]
    return None


def read_container_id(proc_root: Path, pid: int) -> str | None:
    """Container id of a process; None when it is not in a pod. Raises OSError when its cgroup
    cannot be read (no host /proc without hostPID, no permission): then nobody can tell."""
    with (proc_root / str(pid) / "cgroup").open("rb") as f:
        data = f.read(_MAX_CGROUP + 1)
    if len(data) > _MAX_CGROUP:  # a tenant's delegated cgroups can name long paths: unknown
        raise OSError(errno.EFBIG, f"cgroup of pid {pid} is over {_MAX_CGROUP} bytes")
    return container_id(data.decode("utf-8", errors="replace"))


#: a cgroup file's bytes read at most: a line per v1 hierarchy (about 13), each a path
_MAX_CGROUP = 64 * 1024


class ContainerDirectory:
    """Container id -> PodRef from the names in kubelet's container log directory.

    The listing is cached and re-read only when asked for an id it does not know, or for the UID
    of a pod whose log links are gone, at most once per :meth:`begin` (once per collection tick).
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._known: dict[str, PodRef] = {}
        self._uids: dict[tuple[str, str], str] = {}
        #: (namespace, pod) -> the log links its UID was read from
        self._uid_links: dict[tuple[str, str], tuple[Path, ...]] = {}
        self._fresh = False

    def begin(self) -> None:
        """Allow one re-listing in the coming tick."""
        self._fresh = False

    def lookup(self, cid: str) -> PodRef | None:
        if cid not in self._known and not self._fresh:
            self._scan()
        return self._known.get(cid)

    def pod_uid(self, pod: PodRef) -> str | None:
        """The pod's UID from its containers' log links; None when no link names it or links
        name two UIDs (a pod recreated under the same name while the old one's logs remain).
        Read again once the links it came from are gone (the pod was deleted; one made again
        under its name has another UID)."""
        key = (pod.namespace, pod.name)
        if not self._fresh and (key not in self._uids or not self._still_linked(key)):
            self._scan()
        return self._uids.get(key)

    def _still_linked(self, key: tuple[str, str]) -> bool:
        return any(os.path.lexists(link) for link in self._uid_links.get(key, ()))

    def _scan(self) -> None:
        self._fresh = True
        try:
            entries = list(self._log_dir.iterdir())
        except OSError:
            self._known, self._uids, self._uid_links = {}, {}, {}
            return
        known: dict[str, PodRef] = {}
        uids: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
        links: defaultdict[tuple[str, str], list[Path]] = defaultdict(list)
        for entry in entries:
            m = _LOG_LINK.fullmatch(entry.name)
            if not m:
                continue
            known[m["id"]] = PodRef(m["ns"], m["pod"], m["container"])
            try:
                target = os.readlink(entry)
            except OSError:
                continue  # not a link (or gone): no UID from it
            parts = Path(target).parts
            d = _POD_DIR.fullmatch(parts[-3]) if len(parts) >= 3 else None
            if d and (d["ns"], d["pod"]) == (m["ns"], m["pod"]):
                uids[(m["ns"], m["pod"])].add(d["uid"])
                links[(m["ns"], m["pod"])].append(entry)
        self._known = known
        self._uids = {k: next(iter(v)) for k, v in uids.items() if len(v) == 1}
        self._uid_links = {k: tuple(links[k]) for k in self._uids}
