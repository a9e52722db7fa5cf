"""What the doctor's checks read: the agent's own parts, passed in, never opened anew.

Each check is a pure reader of these facts (the config, the driver link, the Kubernetes client,
the allocation mode, the latest telemetry snapshot, the health marks, the state store's
read-only state) plus the host's files under ``proc`` and ``dev``; tests give crafted ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.config import AgentConfig
from agent.dra.mode import Allocation
from agent.gpu.attach import DriverLink
from agent.kube import Requests
from agent.statedir import Unwritable
from agent.telemetry.snapshot import Snapshot
from agent.wire.doctor import Check, CheckState

__all__ = ["CAP_SYS_ADMIN", "NEEDS_NVML", "ApiServer", "Facts", "degraded", "failed", "ok"]

#: The fix of every check of what only NVML can read, while NVML is not there.
NEEDS_NVML = "fix telemetry/nvml first: every GPU duty reads the GPUs through NVML"

#: capability(7) bit of CAP_SYS_ADMIN in /proc/self/status's CapEff mask
CAP_SYS_ADMIN = 21


class ApiServer(Requests, Protocol):
    """What the checks ask of the Kubernetes API server (`agent.kube.InClusterKubeClient`):
    its `request`, and reads."""

    @property
    def server(self) -> str: ...

    def get(self, path: str, query: Mapping[str, str] | None = None) -> object: ...


@dataclass
class Facts:
    config: AgentConfig
    driver: DriverLink
    kube: ApiServer | None
    allocation: Callable[[], Allocation]
    snapshot: Callable[[], Snapshot | None]
    #: (gpu index, instance, xid) -> count since the agent started
    xids: Callable[[], Mapping[tuple[int, int | None, int], int]]
    #: the health marks as shown: target -> (gpu index, mark, reason)
    marks: Callable[[], Mapping[Any, tuple[int, Any, str]]]
    state_read_only: Callable[[], Unwritable | None]
    #: the socket the node's agent serves on (an embedded agent's private one is not it)
    socket_path: Path
    #: why XID events are not watched now (the event set broken, GPUs that deliver none)
    xid_unwatched: Callable[[], str | None] = lambda: None
    #: the GPUs whose power limit is not the stored spec's, each said (`PowerService`)
    power_out_of_force: Callable[[], Sequence[str]] = lambda: ()
    #: per GPU, why a kept MIG journal could not be rolled back ("": none is kept)
    mig_unrolled: Callable[[], str] = lambda: ""
    #: the GPUs (UUIDs) whose pending MIG mode waits for a reboot of this passthrough VM, as
    #: the apply that left it pending found (not a GPU reset)
    mig_reboot: Callable[[], frozenset[str]] = frozenset
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    proc: Path = Path("/proc")
    #: the /proc whose self/ns/pid says the agent's PID namespace (agent/pidns.py):
    #: ``proc`` when None (the simulator's look-alike on a simulated node, as sharing reads it)
    namespace_proc: Path | None = None
    statvfs: Callable[[Path], os.statvfs_result] = os.statvfs

    @property
    def simulated(self) -> bool:
        return bool(self.config.simulate)

    def capabilities(self) -> int | None:
        """This process's effective capability mask; None when /proc does not say."""
        try:
            for line in (self.proc / "self" / "status").read_text().splitlines():
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
        except (OSError, ValueError, IndexError):
            return None
        return None

    def has_sys_admin(self) -> bool | None:
        caps = self.capabilities()
        return None if caps is None else bool(caps >> CAP_SYS_ADMIN & 1)


def ok(duty: str, name: str, evidence: str) -> Check:
    return Check(duty, name, CheckState.OK, evidence)


def degraded(duty: str, name: str, evidence: str, fix: str) -> Check:
    return Check(duty, name, CheckState.DEGRADED, evidence, fix)


def failed(duty: str, name: str, evidence: str, fix: str) -> Check:
    return Check(duty, name, CheckState.FAILED, evidence, fix)
