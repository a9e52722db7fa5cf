"""Who is calling, and what they may do: identity from the connection, access by method as data.

Three doors, told apart by the transport of the call:

* the Unix socket (peer ``unix:``): mode 0600, so only root on the node reaches it; trusted as
  the local admin, it may call everything;
* TCP with mTLS: the client certificate was verified against the configured CA during the
  handshake; its identities are the certificate's subject alternative names (SPIFFE URI, DNS
  name). Every verified client may read; mutating methods need an identity on
  ``tls.mutating_identities``;
* the plaintext loopback listener (only when configured): nobody is authenticated there, so it
  is read-only.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc

log = logging.getLogger(__name__)

__all__ = ["METHOD_ACCESS", "Access", "Caller", "Door", "Policy", "access_of", "caller_of"]


class Access(enum.Enum):
    READ = "read"
    MUTATE = "mutate"


class Door(enum.Enum):
    LOCAL = "local"  # the root-only Unix socket
    MTLS = "mtls"
    ANONYMOUS = "anonymous"  # plaintext loopback


_P = "/gpuagent.v1."

METHOD_ACCESS: Mapping[str, Access] = {
    f"{_P}NodeService/GetNode": Access.READ,
    f"{_P}OperationsService/GetOperation": Access.READ,
    f"{_P}OperationsService/ListOperations": Access.READ,
    f"{_P}OperationsService/WaitOperation": Access.READ,
    f"{_P}OperationsService/WatchOperation": Access.READ,
    f"{_P}OperationsService/CancelOperation": Access.MUTATE,
    f"{_P}MigService/PlanMig": Access.READ,
    f"{_P}MigService/AssertMig": Access.READ,
    f"{_P}MigService/ExportMig": Access.READ,
    f"{_P}MigService/ApplyMig": Access.MUTATE,
    f"{_P}SharingService/GetSharing": Access.READ,
    f"{_P}SharingService/SetSharing": Access.MUTATE,
    f"{_P}SharingService/ClearSharing": Access.MUTATE,
    f"{_P}SharingService/RollbackSharing": Access.MUTATE,
    f"{_P}PrewarmService/SubmitPrewarm": Access.MUTATE,
    f"{_P}PrewarmService/ListPrewarmItems": Access.READ,
    f"{_P}PrewarmService/CancelPrewarmItem": Access.MUTATE,
    f"{_P}PrewarmService/ListCache": Access.READ,
    f"{_P}PrewarmService/EvictCacheItem": Access.MUTATE,
    f"{_P}TelemetryService/GetTelemetrySnapshot": Access.READ,
    f"{_P}EventsService/WatchEvents": Access.READ,
}
"""Every method of the API; a test checks this against the generated services."""

# Standard services every gRPC tool expects to read (grpcurl, grpc_health_probe).
_READ_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.v1alpha.", "/grpc.reflection.v1.")


def access_of(method: str) -> Access:
    """A method not in the table is treated as mutating: a new method fails closed."""
    found = METHOD_ACCESS.get(method)
    if found is not None:
        return found
    return Access.READ if method.startswith(_READ_PREFIXES) else Access.MUTATE


@dataclass(frozen=True, slots=True)
class Caller:
    door: Door
    #: SANs of the client certificate (mTLS only), e.g. spiffe://cluster/ns/x/sa/y.
    identities: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.door is Door.MTLS:
            return "mTLS client " + (", ".join(self.identities) or "without SAN")
        return "local admin (Unix socket)" if self.door is Door.LOCAL else "anonymous (loopback)"


_LOCAL = Caller(Door.LOCAL)
_ANONYMOUS = Caller(Door.ANONYMOUS)


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    if context.peer().startswith("unix:"):
        return _LOCAL
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return _ANONYMOUS
    # The handshake required a client certificate chaining to our CA (mTLS), so these SANs are
    # verified. grpc puts DNS, URI, email and IP SANs into this one property.
    sans = auth.get("x509_subject_alternative_name", [])
    return Caller(Door.MTLS, tuple(s.decode("utf-8", "replace") for s in sans))


@dataclass(frozen=True, slots=True)
class Policy:
    mutating_identities: frozenset[str]

    @classmethod
    def of(cls, identities: Iterable[str]) -> Policy:
        return cls(frozenset(identities))

    def allows(self, caller: Caller, access: Access) -> bool:
        if caller.door is Door.LOCAL or access is Access.READ:
            return True
        return caller.door is Door.MTLS and not self.mutating_identities.isdisjoint(
            caller.identities
        )
