"""Who may call what: the role table covers the whole API, and roles come from identities."""

from __future__ import annotations

from pathlib import Path

from agent.api.auth import (
    METHOD_ROLES,
    OPERATION_ROLES,
    PROCESS_ROLES,
    Caller,
    Door,
    Policy,
    Role,
    allows,
    roles_of,
    sees_processes,
)
from agent.api.operations import API_KINDS
from agent.api.server import _MODULES, SERVICE_NAMES, policy_of
from agent.config import load_config

COORDINATOR = "spiffe://cluster/ns/gpu-system/sa/coordinator"
PREWARMER = "spiffe://cluster/ns/ml-team/sa/prewarm"
READER = "spiffe://cluster/ns/monitoring/sa/dashboard"


def all_methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_method_of_the_api_needs_a_role() -> None:
    assert set(METHOD_ROLES) == all_methods()
    assert {m.split("/")[1] for m in METHOD_ROLES} == set(SERVICE_NAMES)
    assert all(METHOD_ROLES.values())


def test_only_pure_reads_are_open_to_the_read_role() -> None:
    """Plans name processes and lead to an apply: they need mig, like the apply. The metrics
    exposition carries pod labels and per-process figures, which the read role never sees.
    Doctor runs read-only checks and names no GPU process (agent/doctor)."""
    with_processes = {"/gpuagent.v1.TelemetryService/GetMetrics"}
    for method, roles in METHOD_ROLES.items():
        verb = method.rsplit("/", 1)[1]
        reads = verb.startswith(
            ("Get", "List", "Wait", "Watch", "Assert", "Export", "Advise", "Doctor")
        )
        assert (Role.READ in roles) == (reads and method not in with_processes), method
    assert METHOD_ROLES["/gpuagent.v1.MigService/PlanMig"] == {Role.MIG}
    assert all(METHOD_ROLES[m] <= PROCESS_ROLES for m in with_processes)


def test_every_operation_kind_has_the_role_that_may_cancel_it() -> None:
    assert set(OPERATION_ROLES) == set(API_KINDS)


def test_unknown_methods_need_admin_but_standard_services_are_reads() -> None:
    assert roles_of("/gpuagent.v1.NodeService/DeleteNode") == {Role.ADMIN}
    assert roles_of("/grpc.health.v1.Health/Check") == {Role.READ}
    for version in ("v1alpha", "v1"):
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        assert roles_of(method) == {Role.READ}


def test_roles_come_from_identities_and_every_role_reads() -> None:
    policy = Policy.of({Role.READ: ["*"], Role.ADMIN: [COORDINATOR], Role.PREWARM: [PREWARMER]})
    coordinator = Caller(Door.MTLS, ("coordinator.gpu-system.svc", COORDINATOR))
    assert policy.grants(coordinator) == frozenset(Role)
    assert policy.grants(Caller(Door.MTLS, (PREWARMER,))) == {Role.PREWARM, Role.READ}
    assert policy.grants(Caller(Door.MTLS, (READER,))) == {Role.READ}
    assert policy.grants(Caller(Door.LOCAL)) == frozenset(Role)
    assert policy.grants(Caller(Door.ANONYMOUS)) == {Role.READ}
    # Without "*" on read, a certificate with no listed identity may do nothing at all.
    strict = Policy.of({Role.PREWARM: [PREWARMER]})
    assert strict.grants(Caller(Door.MTLS, (READER,))) == frozenset()
    assert strict.grants(Caller(Door.MTLS, (PREWARMER,))) == {Role.PREWARM, Role.READ}


def test_a_prewarm_team_cannot_reconfigure_gpus() -> None:
    grants = frozenset({Role.PREWARM, Role.READ})
    for method, needed in METHOD_ROLES.items():
        service = method.split("/")[1]
        if service in ("gpuagent.v1.MigService", "gpuagent.v1.SharingService"):
            assert allows(grants, needed) == (Role.READ in needed), method
    assert allows(grants, METHOD_ROLES["/gpuagent.v1.PrewarmService/SubmitPrewarm"])
    assert not sees_processes(grants)


def test_the_power_role_caps_power_and_nothing_else(tmp_path: Path) -> None:
    """A facilities identity in roles.power applies and restores power caps; it cannot reshape
    GPUs, change sharing or prewarm, and sees no process lists; mig cannot cap power."""
    config = tmp_path / "agent.yaml"
    facilities = "spiffe://cluster/ns/facilities/sa/power"
    config.write_text(f"roles:\n  power: [{facilities}]\n")
    grants = policy_of(load_config(config, env={})).grants(Caller(Door.MTLS, (facilities,)))
    assert grants == {Role.POWER, Role.READ}
    mutations = {m for m, needed in METHOD_ROLES.items() if Role.READ not in needed}
    allowed = {m for m in mutations if allows(grants, METHOD_ROLES[m])}
    assert allowed == {
        "/gpuagent.v1.PowerService/ApplyPower",
        "/gpuagent.v1.PowerService/RestorePower",
    }
    assert not sees_processes(grants)
    assert not allows(
        frozenset({Role.MIG, Role.READ}), METHOD_ROLES["/gpuagent.v1.PowerService/ApplyPower"]
    )


def test_process_lists_need_mig_or_admin() -> None:
    assert not sees_processes(frozenset({Role.READ, Role.SHARING, Role.PREWARM}))
    assert sees_processes(frozenset({Role.READ, Role.MIG}))
    assert sees_processes(frozenset({Role.ADMIN}))


def test_config_defaults_let_every_verified_client_read_and_nobody_else_act(
    tmp_path: Path,
) -> None:
    policy = policy_of(load_config(env={}))
    assert policy.grants(Caller(Door.MTLS, (READER,))) == {Role.READ}


def test_the_old_mutating_allow_list_still_means_admin(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"tls:\n  mutating_identities: [{COORDINATOR}]\n")
    policy = policy_of(load_config(config, env={}))
    assert policy.grants(Caller(Door.MTLS, (COORDINATOR,))) == frozenset(Role)


def test_roles_refuse_what_cannot_be_an_identity() -> None:
    import pytest

    from agent.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as caught:
        load_config(env={"GPU_AGENT_ROLES__ADMIN": "someone@example.com"})
    assert [v.field for v in caught.value.violations] == ["env GPU_AGENT_ROLES__ADMIN"]
    config = load_config(env={"GPU_AGENT_ROLES__MIG": f"{COORDINATOR},coordinator.gpu-system.svc"})
    assert config.roles.mig == (COORDINATOR, "coordinator.gpu-system.svc")
