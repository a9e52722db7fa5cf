"""Who is calling, and what they may do: identity from the connection, roles by method as data.

Three doors, told apart by the transport of the call:

* the Unix socket (peer ``unix:``): mode 0600, so only root on the node reaches it; trusted as
  the local admin, it holds every role;
* TCP with mTLS: the client certificate was verified against the configured CA during the
  handshake; its identities are the certificate's URI SANs (SPIFFE IDs) and DNS SANs, nothing
  else (an email, IP or common name never is one). The ``roles`` settings map identities to
  roles;
* the plaintext loopback listener (only when configured): nobody is authenticated there, so it
  holds ``read`` alone.

Roles: ``read`` (every read), ``prewarm`` (submit and cancel prewarm items, evict cache items),
``sharing`` (set, clear, roll back the sharing config), ``mig`` (plan and apply MIG layouts),
``power`` (apply and restore power caps: a duty apart from MIG, so a capacity or facilities
identity may cap watts without reshaping GPUs or seeing processes) and ``admin``
(everything). Any role includes ``read``. Process lists (GetNode's processes, the telemetry
snapshot's pods) are shown only to ``mig`` and ``admin``: whoever reshapes GPUs must
see what runs on them; a reader learns only that they were hidden.
"""

from __future__ import annotations

import contextvars
import enum
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc

from agent.owner import ADMIN, Actor

log = logging.getLogger(__name__)

__all__ = [
    "ANY_IDENTITY",
    "METHOD_ROLES",
    "OPERATION_ROLES",
    "PROCESS_ROLES",
    "Caller",
    "Door",
    "Policy",
    "Role",
    "actor_of",
    "allows",
    "caller_of",
    "grant",
    "granted",
    "roles_of",
    "sees_processes",
]


class Role(enum.Enum):
    READ = "read"
    PREWARM = "prewarm"
    SHARING = "sharing"
    MIG = "mig"
    POWER = "power"
    ADMIN = "admin"


class Door(enum.Enum):
    LOCAL = "local"  # the root-only Unix socket
    MTLS = "mtls"
    ANONYMOUS = "anonymous"  # plaintext loopback


ANY_IDENTITY = "*"
"""In a role's identity list: every verified client certificate (not the loopback listener)."""

_P = "/gpuagent.v1."
_R, _W, _S, _M = Role.READ, Role.PREWARM, Role.SHARING, Role.MIG

METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    method: frozenset(roles)
    for method, roles in {
        f"{_P}NodeService/GetNode": {_R},
        # Read-only checks: paths, versions, states; no credential nor process.
        f"{_P}NodeService/Doctor": {_R},
        f"{_P}OperationsService/GetOperation": {_R},
        f"{_P}OperationsService/ListOperations": {_R},
        f"{_P}OperationsService/WaitOperation": {_R},
        f"{_P}OperationsService/WatchOperation": {_R},
        # The door lets any role that owns a kind of operation through; the servicer then checks
        # the role of the operation's own kind (OPERATION_ROLES).
        f"{_P}OperationsService/CancelOperation": {_W, _M},
        # A plan names the processes in the way and is the first half of an apply.
        f"{_P}MigService/PlanMig": {_M},
        f"{_P}MigService/AssertMig": {_R},
        f"{_P}MigService/ExportMig": {_R},
        f"{_P}MigService/AdviseMig": {_R},
        f"{_P}MigService/ApplyMig": {_M},
        f"{_P}MigService/ClaimMig": {_M},
        f"{_P}MigService/ReleaseMigClaim": {_M},
        f"{_P}MigService/GetMigClaim": {_R},
        f"{_P}MigService/RestoreMig": {_M},
        # A reset ends whatever runs on the GPU, as destroying its instances would.
        f"{_P}MigService/ResetGpu": {_M},
        f"{_P}SharingService/GetSharing": {_R},
        f"{_P}SharingService/SetSharing": {_S},
        f"{_P}SharingService/ClearSharing": {_S},
        f"{_P}SharingService/RollbackSharing": {_S},
        f"{_P}PrewarmService/SubmitPrewarm": {_W},
        f"{_P}PrewarmService/ListPrewarmItems": {_R},
        f"{_P}PrewarmService/CancelPrewarmItem": {_W},
        f"{_P}PrewarmService/ListCache": {_R},
        f"{_P}PrewarmService/EvictCacheItem": {_W},
        f"{_P}PrewarmService/DeletePrewarmItem": {_W},
        f"{_P}PrewarmService/PinCacheItem": {_W},
        f"{_P}PowerService/GetPower": {_R},
        f"{_P}PowerService/ApplyPower": {Role.POWER},
        f"{_P}PowerService/RestorePower": {Role.POWER},
        f"{_P}TelemetryService/GetTelemetrySnapshot": {_R},
        # The exposition carries pod labels and per-process figures (PROCESS_ROLES).
        f"{_P}TelemetryService/GetMetrics": {_M},
        f"{_P}EventsService/WatchEvents": {_R},
    }.items()
}
"""Every method of the API and the roles that may call it (any one of them; admin always may).
A test checks this against the generated services."""

OPERATION_ROLES: Mapping[str, Role] = {"mig.apply": Role.MIG, "prewarm": Role.PREWARM}
"""Who may cancel an operation, by its kind."""

PROCESS_ROLES = frozenset({Role.MIG, Role.ADMIN})
"""Roles that see process lists (pids, GPU memory, pods)."""

_ADMIN_ONLY = frozenset({Role.ADMIN})
# Standard services every gRPC tool expects to read (grpcurl, grpc_health_probe).
_READ_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.v1alpha.", "/grpc.reflection.v1.")
_READ_ONLY = frozenset({Role.READ})


def roles_of(method: str) -> frozenset[Role]:
    """A method not in the table needs admin: a new method fails closed."""
    found = METHOD_ROLES.get(method)
    if found is not None:
        return found
    return _READ_ONLY if method.startswith(_READ_PREFIXES) else _ADMIN_ONLY


@dataclass(frozen=True, slots=True)
class Caller:
    door: Door
    #: URI and DNS SANs of the client certificate (mTLS only), e.g. spiffe://cluster/ns/x/sa/y.
    identities: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.door is Door.MTLS:
            return "mTLS client " + (", ".join(self.identities) or "without URI or DNS SAN")
        return "local admin (Unix socket)" if self.door is Door.LOCAL else "anonymous (loopback)"


_LOCAL = Caller(Door.LOCAL)
_ANONYMOUS = Caller(Door.ANONYMOUS)
# grpc's auth context names each SAN type apart; x509_subject_alternative_name merges them all
# (email and IP too), so it must not be read for identities.
_IDENTITY_PROPERTIES = ("peer_uri", "peer_dns")


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    if context.peer().startswith("unix:"):
        return _LOCAL
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return _ANONYMOUS
    # The handshake required a client certificate chaining to our CA (mTLS), so these SANs are
    # verified.
    sans = [san for name in _IDENTITY_PROPERTIES for san in auth.get(name, [])]
    return Caller(Door.MTLS, tuple(s.decode("utf-8", "replace") for s in sans))


@dataclass(frozen=True, slots=True)
class Policy:
    """Identities per role, from the agent config's ``roles`` section."""

    members: Mapping[Role, frozenset[str]]

    @classmethod
    def of(cls, members: Mapping[Role, Iterable[str]]) -> Policy:
        return cls({role: frozenset(members.get(role, ())) for role in Role})

    def grants(self, caller: Caller) -> frozenset[Role]:
        if caller.door is Door.LOCAL:
            return frozenset(Role)
        if caller.door is Door.ANONYMOUS:
            return _READ_ONLY
        held = {
            role
            for role, names in self.members.items()
            if ANY_IDENTITY in names or not names.isdisjoint(caller.identities)
        }
        if Role.ADMIN in held:
            return frozenset(Role)
        return frozenset(held | {Role.READ}) if held else frozenset()


def allows(grants: frozenset[Role], needed: frozenset[Role]) -> bool:
    return Role.ADMIN in grants or not grants.isdisjoint(needed)


def sees_processes(grants: frozenset[Role]) -> bool:
    return not grants.isdisjoint(PROCESS_ROLES)


def actor_of(context: grpc.aio.ServicerContext, acting: Role) -> Actor:
    """The caller of this call as the owner of what it changes (agent/owner.py): ``admin`` when
    it holds admin (the Unix socket, the coordinator), else ``acting``, the role of the work."""
    caller = caller_of(context)
    identity = "local" if caller.door is Door.LOCAL else ",".join(caller.identities)
    return Actor(identity or str(caller), ADMIN if Role.ADMIN in granted() else acting.value)


def claimant_of(context: grpc.aio.ServicerContext) -> str:
    """Whose a MIG claim this caller takes is (agent/mig/claim.py): ``local`` on the Unix
    socket, else its certificate's SANs as a sorted JSON list. Not `actor_of`'s joined text: a
    SAN may hold a comma (a URI SAN plus a DNS SAN read as one URI SAN). "" for a caller with
    no SAN (anonymous, or a certificate without a URI or DNS SAN, admitted by ``*``): every
    such caller would share it, so it may not claim."""
    caller = caller_of(context)
    if caller.door is Door.LOCAL:
        return "local"
    return json.dumps(sorted(set(caller.identities))) if caller.identities else ""


_GRANTED: contextvars.ContextVar[frozenset[Role]] = contextvars.ContextVar(
    "gpu_agent_granted", default=frozenset()
)


def granted() -> frozenset[Role]:
    """The roles of the call being served (set by the interceptor); none outside a call."""
    return _GRANTED.get()


def grant(roles: frozenset[Role]) -> None:
    """Called by the interceptor once per call, in the task that runs the handler."""
    _GRANTED.set(roles)
