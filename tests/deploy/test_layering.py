"""The import rules docs/architecture.md states, checked on the source: every ``import`` of
``agent`` (module level, in functions, under TYPE_CHECKING) is read with ast, so an upward
import fails here instead of growing unnoticed. The known exceptions are listed with their
reason, and one that is gone must leave the list (and the doc) too."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agent"

#: Parts of ``agent`` by layer (docs/architecture.md, "Layers"); a part is a top-level module
#: (``errors``) or package (``prewarm``) of agent/.
BASE = {
    "__init__",
    "errors",
    "operation",
    "safeyaml",
    "clocks",
    "backoff",
    "redact",
    "lockfile",
    "durable",
    "logs",
    "http",
    "statedir",
    "loops",
    "tasks",
    "tables",
    "kube_names",
    "pidns",
    "filestamp",
    "_proto",
}
INFRA = {
    "state",
    "kube",
    "kube_conn",
    "kubeconfig",
    "kube_exec",
    "kube_watch",
    "kube_node",
    "kube_discovery",
    "kube_edge",
    "owner",
    "ownership",
    "webconfig",
}
DOMAIN = {"mig", "sharing", "prewarm", "telemetry", "power", "dra", "health"}
CONFIG = {"config"}  # the schema, its sections and rules, and the loader
#: the API on the wire: messages <-> records and the error mapping, under api/ and client/
WIRE = {"wire"}
ROOTS = {"node", "services", "embedded", "reclaim", "preflight"}  # composition: check, build, wire
#: the read-only checks of every duty: above the API (its socket rule), built by the roots
DOCTOR = {"doctor"}

UPPER = {"api", "client", "coordinator", "cli"}

#: part -> the only parts it may import (besides itself)
ONLY: dict[str, set[str]] = {
    **{b: BASE for b in BASE},
    "gpu": BASE,
    **{i: BASE | INFRA for i in INFRA},
}
#: part -> the parts it must never import
NEVER: dict[str, set[str]] = {
    **{d: CONFIG | WIRE | UPPER | ROOTS | DOCTOR for d in DOMAIN},
    **{c: WIRE | UPPER | ROOTS | DOCTOR for c in CONFIG},
    "wire": CONFIG | UPPER | ROOTS | DOCTOR,
    "api": {"cli", "coordinator", "client"} | ROOTS | DOCTOR,
    "client": {"api", "cli", "coordinator"} | ROOTS | DOCTOR,
    "coordinator": {"api", "cli"} | ROOTS | DOCTOR,
    "doctor": {"cli", "coordinator", "client"} | ROOTS,
    **{r: {"cli"} for r in ROOTS},
}
#: parts that talk to agents, never to a driver: GPU data types yes, NVML or the simulator no
DRIVER = ("agent.gpu.nvml", "agent.gpu.sim")
DRIVERLESS = {"client", "coordinator", "wire"}
#: part -> modules it must never import although their part is allowed: the CLI reaches the
#: agent only through agent.client, so it never touches the servicers nor a generated message;
#: the coordinator reads the agents' answers as records (agent/wire), never as messages; a
#: domain never reads nor builds a message of the agent's own API (agent/wire converts them),
#: only those of the services it is a client of (the CRI, containerd, the kubelet's podresources)
API_MESSAGES = "agent._proto.gpuagent"
NEVER_MODULES: dict[str, tuple[str, ...]] = {
    "cli": ("agent.api", "agent._proto"),
    "coordinator": ("agent._proto",),
    **{d: (API_MESSAGES,) for d in DOMAIN},
}

#: (importing file, imported module) pairs the rules allow by name, and why.
KNOWN_EXCEPTIONS = {
    # Telemetry's service reads its settings type from the agent config (prewarm reads its
    # through a Protocol instead, agent/prewarm/factory.py).
    ("agent/telemetry/service.py", "agent.config"),
    # The coordinator builds the requests a rollout record stores as their messages' JSON
    # (a sharing change's SetSharingRequest, a prewarm's PrewarmTargets): the record's format.
    # It reads no message an agent sends.
    ("agent/coordinator/rollout/specs.py", "agent._proto.gpuagent.v1"),  # builds them
    ("agent/coordinator/rollout/targets.py", "agent._proto.gpuagent.v1"),  # names, checks them
    ("agent/coordinator/rollout/actions.py", "agent._proto.gpuagent.v1"),  # reads them back
}


#: the coordinator's rooms, lowest first (docs/architecture.md, "The coordinator"): a room
#: imports only itself and the rooms before it. ``kube`` and ``flows`` are modules at the
#: coordinator's top: its Kubernetes calls (under every room), and the user-facing flows the CLI
#: and ``control`` run (over fleet, planning and rollout).
ROOMS = ("kube", "fleet", "planning", "rollout", "flows", "control")


def _room(module: str) -> str | None:
    """``agent.coordinator.planning.solve`` -> ``planning``; None outside the coordinator."""
    parts = module.split(".")
    if parts[:2] != ["agent", "coordinator"] or len(parts) < 3:
        return None
    return parts[2]


def _part(module: str) -> str | None:
    """``agent.prewarm.store`` -> ``prewarm``; ``agent`` itself -> ``__init__``."""
    parts = module.split(".")
    if parts[0] != "agent":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports(path: Path) -> Iterator[str]:
    """Every agent module ``path`` imports, at any depth of the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "agent":  # from agent import config: the module named
                yield from (f"agent.{a.name}" for a in node.names)
            else:
                yield node.module


@functools.cache
def _edges() -> list[tuple[str, str, str, str]]:
    """(file, its part, imported module, that module's part) for every import of agent."""
    return list(_walk())


def _walk() -> Iterator[tuple[str, str, str, str]]:
    for path in sorted(AGENT.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        here = path.relative_to(AGENT).parts[0].removesuffix(".py")
        if here == "_proto":
            continue  # generated: imports only itself and protobuf (checked below)
        for module in _imports(path):
            there = _part(module)
            if there is not None and there != here:
                yield rel, here, module, there


def _forbidden(here: str, module: str) -> bool:
    """Whether part ``here`` may not import ``module`` by the rules above."""
    there = _part(module)
    if there is None or there == here:
        return False
    if here in ONLY and there not in ONLY[here]:
        return True
    if there in NEVER.get(here, set()):
        return True
    if any(_within(module, m) for m in NEVER_MODULES.get(here, ())):
        return True
    return here in DRIVERLESS and module.startswith(DRIVER)


def _within(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def test_every_part_of_agent_has_a_layer() -> None:
    """A new top-level module or package is placed in a layer here and in the doc."""
    parts = {
        p.name.removesuffix(".py")
        for p in AGENT.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    placed = BASE | INFRA | DOMAIN | CONFIG | WIRE | DOCTOR | ROOTS | UPPER | {"gpu"}
    assert parts - placed == set(), "add it to a layer in tests/deploy/test_layering.py"


def test_no_part_of_agent_imports_upward() -> None:
    found = [
        f"{rel} imports {module} ({here} -> {there})"
        for rel, here, module, there in _edges()
        if _forbidden(here, module) and (rel, module) not in KNOWN_EXCEPTIONS
    ]
    assert found == [], "upward imports (docs/architecture.md, Layers):\n" + "\n".join(found)


def _room_of(rel: str) -> str | None:
    return _room(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))


def _upward_room(rel: str, module: str) -> bool:
    here, there = _room_of(rel), _room(module)
    if here is None or there is None or here == there:
        return False
    return ROOMS.index(there) > ROOMS.index(here)


def test_every_module_of_the_coordinator_is_in_a_room() -> None:
    """A new coordinator module goes into a room (a new room: here and in the doc)."""
    found = {
        _room_of(p.relative_to(REPO).as_posix())
        for p in (AGENT / "coordinator").rglob("*.py")
        if p.name != "__init__.py" or p.parent != AGENT / "coordinator"
    }
    assert found - set(ROOMS) == set()


def test_no_room_of_the_coordinator_imports_a_later_one() -> None:
    found = [
        f"{rel} imports {module}"
        for path in sorted((AGENT / "coordinator").rglob("*.py"))
        for rel in [path.relative_to(REPO).as_posix()]
        for module in _imports(path)
        if _upward_room(rel, module)
    ]
    assert found == [], "rooms: " + " < ".join(ROOMS) + "\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("here", "module"),
    [
        ("agent/coordinator/fleet/inventory.py", "agent.coordinator.planning.catalog"),
        ("agent/coordinator/planning/planner.py", "agent.coordinator.rollout.schedule"),
        ("agent/coordinator/rollout/actions.py", "agent.coordinator.flows"),
        ("agent/coordinator/flows.py", "agent.coordinator.control.lease"),
        ("agent/coordinator/kube.py", "agent.coordinator.fleet.discovery"),
    ],
)
def test_the_room_rule_refuses_a_later_room(here: str, module: str) -> None:
    assert _upward_room(here, module)


def test_the_cli_is_imported_by_nothing() -> None:
    found = [f"{rel} imports {m}" for rel, here, m, there in _edges() if there == "cli"]
    assert found == []


def test_the_cli_reaches_the_agent_only_through_the_client() -> None:
    """No servicer, no generated message: the client answers the CLI in records (agent/wire)."""
    found = [
        f"{rel} imports {m}"
        for rel, here, m, _ in _edges()
        if here == "cli" and any(_within(m, p) for p in NEVER_MODULES["cli"])
    ]
    assert found == []


def test_the_coordinator_reads_no_message_from_an_agent() -> None:
    """The async client answers the coordinator in records (agent/wire); only the named
    builders of a rollout record's requests import generated code."""
    found = [
        f"{rel} imports {m}"
        for rel, here, m, _ in _edges()
        if here == "coordinator"
        and any(_within(m, p) for p in NEVER_MODULES["coordinator"])
        and (rel, m) not in KNOWN_EXCEPTIONS
    ]
    assert found == []


def test_no_domain_reads_a_message_of_the_agent_api() -> None:
    """The domains (agent/prewarm's target schema among them) hold records; the API's messages
    are read and built in agent/wire alone."""
    found = [
        f"{rel} imports {m}"
        for rel, here, m, _ in _edges()
        if here in DOMAIN and _within(m, API_MESSAGES)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("here", "module"),
    [
        ("prewarm", "agent._proto.k8s.cri.runtime.v1"),
        ("prewarm", "agent._proto.containerd.services.images.v1"),
        ("telemetry", "agent._proto.k8s.podresources.v1"),
    ],
)
def test_a_domain_may_read_the_messages_of_a_service_it_calls(here: str, module: str) -> None:
    assert not _forbidden(here, module)


def test_the_known_exceptions_are_still_there() -> None:
    """An exception that is gone leaves this list and docs/architecture.md."""
    seen = {(rel, module) for rel, _, module, _ in _edges()}
    assert KNOWN_EXCEPTIONS - seen == set()


def test_generated_code_imports_only_itself() -> None:
    for path in (AGENT / "_proto").rglob("*.py"):
        for module in _imports(path):
            assert module.startswith("agent._proto") or _part(module) is None, (path, module)


@pytest.mark.parametrize(
    ("here", "module"),
    [
        ("agent/gpu/nvml.py", "agent.state"),
        ("agent/prewarm/store.py", "agent.api.prewarm"),
        ("agent/prewarm/store.py", "agent.wire.prewarm"),
        ("agent/prewarm/factory.py", "agent.config"),
        ("agent/api/prewarm.py", "agent.client"),
        ("agent/client/agent.py", "agent.api.prewarm"),
        ("agent/coordinator/rollout/schedule.py", "agent.api.operations"),
        ("agent/wire/node.py", "agent.api.inventory"),
        ("agent/wire/errors.py", "agent.client.errors"),
        ("agent/wire/sharing.py", "agent.config"),
        ("agent/wire/node.py", "agent.node"),
        ("agent/wire/prewarm.py", "agent.coordinator.fleet.inventory"),
        ("agent/wire/node.py", "agent.gpu.nvml"),
        ("agent/cli/status.py", "agent.api.inventory"),
        ("agent/cli/share.py", "agent.api"),
        ("agent/cli/status.py", "agent._proto.gpuagent.v1.agent_pb2"),
        ("agent/cli/fleet/apply.py", "agent._proto"),
        ("agent/errors.py", "agent.gpu"),
        ("agent/state/store.py", "agent.prewarm.model"),
        ("agent/node.py", "agent.cli.main"),
        ("agent/coordinator/fleet/channels.py", "agent.gpu.nvml"),
        ("agent/coordinator/fleet/inventory.py", "agent._proto.gpuagent.v1.agent_pb2"),
        ("agent/coordinator/rollout/specs.py", "agent._proto"),
        ("agent/client/agent.py", "agent.gpu.sim"),
        ("agent/kube.py", "agent.prewarm"),
        ("agent/prewarm/target.py", "agent._proto.gpuagent.v1"),
        ("agent/prewarm/target.py", "agent._proto.gpuagent.v1.prewarm_pb2"),
        ("agent/mig/plan.py", "agent._proto.gpuagent.v1.mig_pb2"),
    ],
)
def test_the_rules_refuse_an_upward_import(here: str, module: str) -> None:
    """The checker itself: each of these would be reported."""
    assert _forbidden(Path(here).relative_to("agent").parts[0].removesuffix(".py"), module)
