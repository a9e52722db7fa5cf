"""`gpu-agent fleet status` over mTLS against four agent processes on different simulated
nodes: one row per node, MIG slice maps, idle devices, totals per profile, and a node that
stops answering shown as unreachable, not as an error."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.unit.api.support import Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet

pytestmark = pytest.mark.integration

PRESETS = {"h100": "dgx-h100", "a100": "dgx-a100", "a30": "a30-node", "nvl": "h100-nvl"}


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet")
    with AgentFleet(root, Pki(root / "pki"), PRESETS) as fleet:
        yield fleet


def status(agents: AgentFleet, *extra: str) -> dict:
    result = agents.fleet("status", "--nodes", "-o", "json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_one_row_per_node_with_its_gpus_and_models(agents: AgentFleet) -> None:
    data = status(agents)
    rows = {n["name"]: n for n in data["nodes"]}
    assert sorted(rows) == ["a100", "a30", "h100", "nvl"]
    assert {n: len(r["gpus"]) for n, r in rows.items()} == {
        "a100": 8,
        "a30": 4,
        "h100": 8,
        "nvl": 2,
    }
    assert rows["a30"]["models"] == "4x A30"
    assert rows["nvl"]["models"] == "2x H100 NVL"
    assert all(r["health"] in ("ok", "unhealthy") for r in rows.values())
    assert {g["slices"] for g in rows["h100"]["gpus"]} == {"-"}  # MIG off on a fresh node
    totals = data["totals"]
    health = totals["gpu_health"]
    assert (totals["nodes"], totals["reachable"], totals["gpus"], totals["idle_gpus"]) == (
        4,
        4,
        22,
        0,
    )
    assert totals["node_health"] == {"ok": 4, "unhealthy": 0, "unreachable": 0}
    assert totals["models"] == {
        "2x H100 NVL": 1,
        "4x A30": 1,
        "8x A100-SXM4-40GB": 1,
        "8x H100 80GB HBM3": 1,
    }
    # Every GPU counted once by its verdict (unknown where the agent gives none), none failed.
    assert sum(health.values()) == 22 and health["failed"] == 0


def test_idle_gpus_come_with_the_inventory(agents: AgentFleet) -> None:
    """Each agent's GetNode carries its sampler's idle seconds per GPU: nothing on these nodes
    runs, so every GPU is idle for at least 0 s once the sampler and inventory have a tick."""

    def all_idle() -> dict | None:
        data = status(agents, "--idle-after", "0s")
        return data if data["totals"]["idle_gpus"] == 22 else None

    data = wait_for(all_idle, "every GPU counted idle", timeout=30, every=0.5)
    assert {n["name"]: n["idle_gpus"] for n in data["nodes"]} == {
        "a100": 8,
        "a30": 4,
        "h100": 8,
        "nvl": 2,
    }
    assert status(agents, "--idle-after", "1d")["totals"]["idle_gpus"] == 0


def test_mig_layouts_show_as_slice_maps_and_idle_devices(agents: AgentFleet) -> None:
    """A layout applied through the API shows up in the next sweep."""
    config = agents.root / "a30.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  half:\n    - devices: [0]\n      mig-enabled: true\n"
        "      mig-devices: {2g.12gb: 1, 1g.6gb: 2}\n"
    )
    result = agents.fleet(
        "apply", "mig", "-f", str(config), "-c", "half", "-o", "json", names=["a30"]
    )
    assert result.exit_code == 0, result.output

    def a30_gpu0() -> dict | None:
        rows = {n["name"]: n for n in status(agents)["nodes"]}
        gpu0 = rows["a30"]["gpus"][0]
        # The inventory refreshes in the background: it may show the mode switch before the
        # instances, so wait for the whole layout.
        return gpu0 if sorted(gpu0["slices"]) == sorted("1122") else None

    gpu0 = wait_for(a30_gpu0, "the A30's new layout in the inventory", timeout=60)
    assert sorted(gpu0["slices"]) == sorted("1122")
    assert gpu0["idle"] == {"1g.6gb": 2, "2g.12gb": 1}
    profiles = {p["profile"]: p for p in status(agents)["profiles"]}
    assert profiles["1g.6gb"]["devices"] == 2 and profiles["1g.6gb"]["idle"] == 2


def test_the_table_names_every_node_and_explains_the_slice_map(agents: AgentFleet) -> None:
    result = agents.fleet("status", "--nodes")
    assert result.exit_code == 0, result.output
    for name in PRESETS:
        assert name in result.output
    assert "4 node(s), 4 answering; 22 GPU(s)" in result.output


def test_a_node_that_stops_answering_is_shown_unreachable(agents: AgentFleet) -> None:
    nvl = agents.agents["nvl"]
    address = agents.address("nvl")
    nvl.stop()
    try:
        data = status(agents)
        row = next(n for n in data["nodes"] if n["address"] == address)
        assert row["health"] == "unreachable"
        assert data["totals"]["reachable"] == 3
        selected = status(agents, "--selector", "model=*A30*")
        # A node that does not answer may be an A30: it stays in view rather than vanish.
        assert {n["name"] for n in selected["nodes"]} == {"a30", address}
        # The default answer: counts, and only the node that needs attention.
        summary = json.loads(agents.fleet("status", "-o", "json").output)
        assert "nodes" not in summary
        assert [n["address"] for n in summary["attention"]] == [address]
        assert summary["totals"]["node_health"] == {"ok": 3, "unhealthy": 0, "unreachable": 1}
        assert summary["totals"]["attention"] == 1
        table = agents.fleet("status").output
        assert "1 node(s) need attention" in table and address in table
        assert "a30 " not in table and "Nodes: 3 ok, 1 unreachable." in table
    finally:
        nvl.start(timeout=120)
