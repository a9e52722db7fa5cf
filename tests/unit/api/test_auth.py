"""Who may call what: the method table covers the whole API, and the policy is read/mutate."""

from __future__ import annotations

from agent.api.auth import METHOD_ACCESS, Access, Caller, Door, Policy, access_of
from agent.api.server import _MODULES, SERVICE_NAMES

COORDINATOR = "spiffe://cluster/ns/gpu-system/sa/coordinator"


def all_methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_method_of_the_api_has_an_access_level() -> None:
    assert set(METHOD_ACCESS) == all_methods()
    assert {m.split("/")[1] for m in METHOD_ACCESS} == set(SERVICE_NAMES)


def test_methods_named_like_reads_are_reads() -> None:
    for method, access in METHOD_ACCESS.items():
        verb = method.rsplit("/", 1)[1]
        reads = verb.startswith(("Get", "List", "Wait", "Watch", "Plan", "Assert", "Export"))
        assert (access is Access.READ) == reads, method


def test_unknown_methods_fail_closed_but_standard_services_are_reads() -> None:
    assert access_of("/gpuagent.v1.NodeService/DeleteNode") is Access.MUTATE
    assert access_of("/grpc.health.v1.Health/Check") is Access.READ
    assert access_of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is (
        Access.READ
    )


def test_policy() -> None:
    policy = Policy.of([COORDINATOR])
    coordinator = Caller(Door.MTLS, ("coordinator.gpu-system.svc", COORDINATOR))
    reader = Caller(Door.MTLS, ("spiffe://cluster/ns/monitoring/sa/dashboard",))
    anonymous = Caller(Door.ANONYMOUS)
    local = Caller(Door.LOCAL)
    assert all(policy.allows(c, Access.READ) for c in (coordinator, reader, anonymous, local))
    assert policy.allows(coordinator, Access.MUTATE)
    assert policy.allows(local, Access.MUTATE)
    assert not policy.allows(reader, Access.MUTATE)
    assert not policy.allows(anonymous, Access.MUTATE)
    assert not Policy.of([]).allows(coordinator, Access.MUTATE)
