"""Rollouts across four agent processes on simulated nodes, over mTLS: a dry run that changes
nothing; max-unavailable respected, as the agents' own operation records show; a node whose
apply fails (an injected NVML fault) halting the rollout at max-failures; the halted rollout
resumed from its record; sharing rolled out; a file prewarmed with a concurrency limit; a model
repo snapshot prewarmed as one ready item on every node."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.prewarm_fixtures import hub
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet, most_at_once, op_intervals

pytestmark = pytest.mark.integration

# Presets whose GPUs all offer 3g.40gb and 1g.10gb (A100-80GB and H100 80GB).
PRESETS = {"a": "dgx-h100", "b": "dgx-a100-80", "c": "mixed", "d": "dgx-h100"}

MIG = """\
version: v1
mig-configs:
  halves:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
  small:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {3g.40gb: 1, 1g.10gb: 3}
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet")
    with AgentFleet(root, Pki(root / "pki"), PRESETS) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def mig_file(agents: AgentFleet) -> Path:
    path = agents.root / "mig.yaml"
    path.write_text(MIG)
    return path


def run_json(agents: AgentFleet, *args: str, code: int = 0) -> dict:
    result = agents.fleet(*args, "-o", "json")
    assert result.exit_code == code, result.output
    return json.loads(result.output[result.output.index("{") :])


def node_states(record: dict) -> dict[str, str]:
    return {n: r["state"] for n, r in record["nodes"].items()}


def test_a_dry_run_shows_every_nodes_plan_and_changes_nothing(
    agents: AgentFleet, mig_file: Path
) -> None:
    data = run_json(agents, "apply", "mig", "-f", str(mig_file), "-c", "halves", "--dry-run")
    previews = {p["node"]: p for p in data["previews"]}
    assert sorted(previews) == ["a", "b", "c", "d"]
    for preview in previews.values():
        assert preview["would"] == "change"
        assert [g["gpu"] for g in preview["gpus"]] == [0, 1]
        assert preview["gpus"][0]["create"] == ["3g.40gb@0:4", "3g.40gb@4:4"]
    assert agents.operations("a", "mig.apply") == []


def test_a_rollout_never_has_more_nodes_changing_than_max_unavailable(
    agents: AgentFleet, mig_file: Path, tmp_path: Path
) -> None:
    record = tmp_path / "rollout.json"
    data = run_json(
        agents,
        "apply", "mig", "-f", str(mig_file), "-c", "halves",
        "--max-unavailable", "50%", "--record", str(record),
    )  # fmt: skip
    assert node_states(data["record"]) == dict.fromkeys("abcd", "succeeded")
    ops = [op for name in PRESETS for op in agents.operations(name, "mig.apply")]
    assert len(ops) == 4 and all(op.done for op in ops)
    # The agents' own records: at most two nodes were ever mid-apply at once (and two were).
    assert most_at_once(op_intervals(ops)) == 2
    saved = json.loads(record.read_text())
    assert node_states(saved) == dict.fromkeys("abcd", "succeeded") and saved["halted"] is None
    # Applying the same again changes nothing and starts no operation.
    again = run_json(agents, "apply", "mig", "-f", str(mig_file), "-c", "halves")
    assert node_states(again["record"]) == dict.fromkeys("abcd", "unchanged")
    assert len([op for n in PRESETS for op in agents.operations(n, "mig.apply")]) == 4


def test_a_failing_node_halts_the_rollout_and_a_resume_finishes_it(
    agents: AgentFleet, mig_file: Path, tmp_path: Path
) -> None:
    record = tmp_path / "halted.json"
    agents.sim("b", "fault", "nvmlDeviceCreateGpuInstanceWithPlacement", "Unknown", "--count", "99")
    try:
        result = agents.fleet(
            "apply", "mig", "-f", str(mig_file), "-c", "small",
            "--max-unavailable", "1", "--max-failures", "1", "--record", str(record),
        )  # fmt: skip
        assert result.exit_code == 10, result.output
        assert "halted after 1 failed node(s) (max-failures 1): b" in result.output
        assert f"resume with: gpu-agent fleet resume {record}" in result.output
    finally:
        agents.sim("b", "fault", "-", "-", "--clear")
    saved = json.loads(record.read_text())
    assert node_states(saved) == {"a": "succeeded", "b": "failed", "c": "pending", "d": "pending"}
    assert saved["nodes"]["b"]["operation"].startswith("operations/")
    applied_on_a = len(agents.operations("a", "mig.apply"))

    before = record.read_text()
    bad = agents.fleet("resume", str(record), "--max-unavailable", "0")
    assert bad.exit_code == 2 and "max-unavailable '0'" in bad.output
    assert record.read_text() == before  # refused: nothing changed
    # The resume may change the limits: three nodes left, two at a time, three failures.
    resumed = run_json(
        agents, "resume", str(record), "--max-unavailable", "2", "--max-failures", "3"
    )
    assert node_states(resumed["record"]) == {
        "a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "succeeded"
    }  # fmt: skip
    assert resumed["record"]["nodes"]["b"]["attempt"] == 2
    saved = json.loads(record.read_text())
    assert (saved["max_unavailable"], saved["max_failures"]) == ("2", 3)
    last = [agents.operations(n, "mig.apply")[0] for n in "bcd"]  # newest first
    assert most_at_once(op_intervals(last)) == 2
    assert len(agents.operations("a", "mig.apply")) == applied_on_a  # a was not touched again
    status = {n["name"]: n for n in run_json(agents, "status", "--nodes")["nodes"]}
    for name in PRESETS:
        assert status[name]["gpus"][0]["devices"] == {"1g.10gb": 3, "3g.40gb": 1}


def test_sharing_rolls_out_and_a_second_run_changes_nothing(agents: AgentFleet) -> None:
    args = ("apply", "share", "--strategy", "time-slicing", "--replicas", "4")
    first = run_json(agents, *args, "--max-unavailable", "2")
    assert node_states(first["record"]) == dict.fromkeys("abcd", "succeeded")
    second = run_json(agents, *args)
    assert node_states(second["record"]) == dict.fromkeys("abcd", "unchanged")

    def shared() -> bool:  # the agents re-read the plugin's config every few seconds
        rows = run_json(agents, "status", "--nodes")["nodes"]
        # reload none, and no plugin runs on a simulated node: it has not loaded the file
        return {r["sharing"] for r in rows} == {"time-slicing nvidia.com/gpu x4 (not loaded)"}

    wait_for(shared, "every node to show time-slicing", timeout=30, every=1.0)


def test_a_dry_run_of_a_sharing_file_shows_each_nodes_sharing_and_the_change(
    agents: AgentFleet, tmp_path: Path
) -> None:
    """-f FILE used to preview as "unknown": the dry run now reads each node's config and
    shows what the file would make of it, as the agent would decide; a file every node would
    refuse is refused before any node is asked."""
    text = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{{name: gpu, replicas: {}}}]\n"
    four, eight, one = (tmp_path / f"ts{n}.yaml" for n in (4, 8, 1))
    for path, n in ((four, 4), (eight, 8), (one, 1)):
        path.write_text(text.format(n))
    applied = run_json(agents, "apply", "share", "-f", str(four), "--max-unavailable", "4")
    assert set(node_states(applied["record"]).values()) <= {"succeeded", "unchanged"}

    same = {
        p["node"]: p
        for p in run_json(agents, "apply", "share", "-f", str(four), "--dry-run")["previews"]
    }
    assert {n: p["would"] for n, p in same.items()} == dict.fromkeys("abcd", "unchanged")
    assert {p["current"] for p in same.values()} == {"time-slicing nvidia.com/gpu x4"}

    more = run_json(agents, "apply", "share", "-f", str(eight), "--dry-run")["previews"]
    assert {p["would"] for p in more} == {"change"}
    assert {p["planned"] for p in more} == {"time-slicing nvidia.com/gpu x8"}
    assert all(
        p["detail"] == "now: time-slicing nvidia.com/gpu x4; planned: time-slicing "
        "nvidia.com/gpu x8 (changes sharing.timeSlicing.resources)"
        for p in more
    ), more
    # A config every node refuses (replicas 1) is refused once, up front; one these nodes
    # refuse by their GPUs (a MIG resource, no MIG here) is each node's `refused`.
    everywhere = agents.fleet("apply", "share", "-f", str(one), "--dry-run")
    assert everywhere.exit_code == 2, everywhere.output
    assert "every node would refuse" in everywhere.output, everywhere.output
    mig = tmp_path / "mig.yaml"
    mig.write_text(text.replace("gpu,", "mig-1g.10gb,").format(2))
    refused = run_json(agents, "apply", "share", "-f", str(mig), "--dry-run")["previews"]
    assert {p["would"] for p in refused} == {"refused"}
    table = agents.fleet("apply", "share", "-f", str(eight), "--dry-run")
    assert "planned: time-slicing nvidia.com/gpu x8" in table.output
    assert "unknown" not in table.output


def test_prewarm_fans_out_with_a_concurrency_limit(agents: AgentFleet, tmp_path: Path) -> None:
    with Origin(tmp_path / "origin") as origin:
        (tmp_path / "origin").mkdir(exist_ok=True)
        sha = origin.add("weights.bin", os.urandom(512 * 1024))
        origin.faults.rate_bps["/weights.bin"] = 512 * 1024  # about a second per node
        data = run_json(
            agents,
            "prewarm", "--url", origin.url("weights.bin"), "--sha256", sha, "--name", "weights",
            "--max-unavailable", "2", "--max-failures", "0",
        )  # fmt: skip
    assert node_states(data["record"]) == dict.fromkeys("abcd", "succeeded")
    ops = [op for name in PRESETS for op in agents.operations(name, "prewarm")]
    assert len(ops) == 4 and most_at_once(op_intervals(ops)) == 2

    def warm() -> bool:  # the agents re-read their cache every few seconds
        rows = run_json(agents, "status", "--nodes")["nodes"]
        return {r["name"]: r["warm"] for r in rows} == dict.fromkeys("abcd", 1)

    wait_for(warm, "the item warm on every node", timeout=30, every=1.0)


def test_prewarm_of_a_model_makes_it_one_ready_item_on_every_node(
    agents: AgentFleet, tmp_path: Path
) -> None:
    """`fleet prewarm --model` warms a Hugging Face style repo snapshot (from a local origin)
    on every node as one item: each node lists the model ready at its full size, and the
    node label it publishes for it is ``cache.<name>=ready``."""
    root = tmp_path / "hub"
    root.mkdir()
    files = hub.tiny_model()
    with Origin(root) as origin:
        endpoint, commit = hub.publish(origin, "org-a/Tiny-Llama", files)
        data = run_json(
            agents,
            "prewarm", "--model", "org-a/Tiny-Llama", "--endpoint", endpoint,
            "--include", "*.json", "--include", "*.safetensors", "--name", "tiny-llama",
            "--max-unavailable", "2", "--max-failures", "0",
        )  # fmt: skip
        resolved = {r.path for r in origin.requests if "/resolve/" in r.path}
    assert node_states(data["record"]) == dict.fromkeys("abcd", "succeeded")
    for name in PRESETS:
        item = hub.ready_model(agents.cache(name), "tiny-llama")
        assert item is not None, (name, agents.cache(name))
        assert item.size_bytes == sum(len(d) for d in files.values())
        assert item.options["commit"] == commit
    assert resolved == {f"/org-a/Tiny-Llama/resolve/{commit}/{p}" for p in files}


def test_a_fleet_plan_is_applied_with_fleet_apply_and_meets_the_demand(
    agents: AgentFleet, tmp_path: Path
) -> None:
    """`fleet plan --out` then `fleet apply mig --plan`: the demand is met, nothing in the
    way is destroyed, and the agents' layouts are the ones the plan predicted."""
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand:\n  3g.40gb: 12\n  1g.10gb: 24\n")
    plan_file = tmp_path / "plan.yaml"
    planned = run_json(agents, "plan", "--demand", str(demand), "--out", str(plan_file))
    assert planned["unmet"] == [] and planned["destroyed"] == 0
    predicted = {
        (c["node"], c["index"]): {
            i
            for gi in c["target"]
            for i in range(
                gi["placement"]["start"], gi["placement"]["start"] + gi["placement"]["size"]
            )
        }
        for c in planned["changes"]
    }
    applied = run_json(agents, "apply", "mig", "--plan", str(plan_file), "--max-unavailable", "2")
    assert set(node_states(applied["record"]).values()) == {"succeeded"}

    def layouts() -> dict[str, dict] | None:
        # Rows and totals from one answer: rows read before the layouts settle are stale.
        status = run_json(agents, "status", "--nodes")
        rows = {n["name"]: n for n in status["nodes"]}
        totals = {p["profile"]: p["devices"] for p in status["profiles"]}
        done = totals.get("3g.40gb") == 12 and totals.get("1g.10gb") == 24
        return rows if done else None

    rows = wait_for(layouts, "the planned layouts on the agents", timeout=60, every=1.0)
    for (node, index), used in predicted.items():
        slices = rows[node]["gpus"][index]["slices"]
        assert {i for i, c in enumerate(slices) if c != "."} == used, (node, index, slices)
