"""Fleet commands account for every selected node (docs/coordinator.md): a rollout's dry run
lists one that does not answer as `unknown` with its error, never leaves it out; a node that
cannot start because such nodes took max-unavailable says so; a plan's node no agent answers
as stays in the rollout; rightsize names the nodes it could not observe."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.unit.coordinator.agents import invoke_process
from tests.unit.coordinator.fakeagents import driverless_node, fake_agents, mark, node


def test_a_dry_run_shows_a_node_that_does_not_answer_as_unknown() -> None:
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        gone = f"unix:{agents.root / 'gone.sock'}"
        args = ["--agents", f"{agents.agents['a'].address},{gone}", "--insecure"]
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        as_json = invoke_process([*share, "--dry-run", *args, "-o", "json"], 60)
        table = invoke_process([*share, "--dry-run", *args], 60)
    assert as_json.exit_code == 0, as_json.output
    previews = {p["node"]: p for p in json.loads(as_json.output)["previews"]}
    assert sorted(previews) == sorted(["a", gone])
    assert previews["a"]["would"] == "change"
    assert previews[gone]["would"] == "unknown"
    assert "did not answer" in previews[gone]["detail"], previews[gone]
    row = next(line for line in table.output.splitlines() if line.startswith(gone))
    assert row.split()[1] == "unknown", table.output


def test_a_rollout_whose_budget_is_taken_by_nodes_that_do_not_answer_says_so() -> None:
    """One node does not answer and max-unavailable is 1: it takes the budget, so nothing may
    start. The healthy node stayed `pending` with no detail, and the command said 'others
    failed or did not answer'. Its row and the error now say why it waits, and so does the
    --record file `fleet resume` reads (it was saved before the reason was set)."""
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        gone = f"unix:{agents.root / 'gone.sock'}"
        args = ["--agents", f"{agents.agents['a'].address},{gone}", "--insecure"]
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        record = agents.root / "rollout.json"
        as_json = invoke_process([*share, *args, "-o", "json", "--record", str(record)], 60)
        saved = json.loads(record.read_text())["nodes"]["a"]
        set_sharing = agents.agents["a"].calls.count("SharingService/SetSharing")
    assert as_json.exit_code == 10, as_json.output
    doc = json.loads(as_json.output.split("\nerror:")[0])
    a = doc["record"]["nodes"]["a"]
    assert a["state"] == "pending" and set_sharing == 0
    assert "max-unavailable is 1" in a["detail"], a
    assert saved["detail"] == a["detail"], saved
    error = as_json.output.split("\nerror:")[1]
    assert "max-unavailable is 1" in error and "failed" not in error, error


def _plan(path: Path, *nodes: str) -> Path:
    config = "version: v1\nmig-configs:\n  fleet-plan:\n  - {devices: all, mig-enabled: false}\n"
    entries = {n: {"config": config, "gpus": []} for n in nodes}
    path.write_text(yaml.safe_dump({"kind": "FleetMigPlan", "version": "v1", "nodes": entries}))
    return path


def test_a_plan_node_no_agent_answers_as_is_not_dropped() -> None:
    """A plan names nodes; one no agent answers as (gone, renamed, another cluster's plan) was
    dropped without a word and the rollout succeeded; with none found the command said 'no
    node matches the selector (every node)'. The missing node is kept in the rollout, not
    reached (exit 10), and a plan none of whose nodes is found is refused naming them."""
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        args = [*agents.args(), "-o", "json"]
        both = _plan(agents.root / "both.yaml", "a", "z")
        dry = invoke_process(["fleet", "apply", "mig", "--plan", str(both), "--dry-run", *args])
        run = invoke_process(["fleet", "apply", "mig", "--plan", str(both), *args])
        alone = _plan(agents.root / "z.yaml", "z")
        none = invoke_process(["fleet", "apply", "mig", "--plan", str(alone), *args], 60)
    assert dry.exit_code == 0, dry.output
    previews = {p["node"]: p for p in json.loads(dry.output)["previews"]}
    assert previews["z"]["would"] == "unknown" and "z" in previews["z"]["detail"], previews
    assert run.exit_code == 10, run.output
    z = json.loads(run.output.split("\nerror:")[0])["record"]["nodes"]["z"]
    assert (z["state"], z["detail"]) == ("pending", "skipped: the agent did not answer"), z
    assert none.exit_code == 2, none.output
    assert "z" in none.output and "every node" not in none.output, none.output


def test_rightsize_names_a_node_that_does_not_answer_as_not_observed() -> None:
    """A node whose agent did not answer was never asked for telemetry and not said: `0 of 0
    pod(s) fit` read as a fleet with nothing to size. It is listed under no telemetry, with
    its error, in the table and in `-o json` (`failed`)."""
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        gone = f"unix:{agents.root / 'gone.sock'}"
        args = ["--agents", f"{agents.agents['a'].address},{gone}", "--insecure"]
        rightsize = ["fleet", "rightsize", "--window", "0", *args]
        as_json = invoke_process([*rightsize, "-o", "json"], 60)
        table = invoke_process(rightsize, 60)
    assert as_json.exit_code == 0, as_json.output
    failed = json.loads(as_json.output)["failed"]
    assert list(failed) == [gone] and "did not answer" in failed[gone], failed
    assert f"No telemetry from {gone}: " in table.output, table.output


def test_a_sharing_dry_run_on_a_node_whose_gpus_were_not_read_is_skipped_not_refused() -> None:
    """Its driver is not loaded, so its agent lists no GPU: the preview checked the config
    against no GPU and said `refused: … the plugin does not advertise nvidia.com/gpu on this
    node …; valid here: none`, a verdict on GPUs nobody read (the agent's SetSharing refuses
    with DriverNotReady). It is skipped, with the driver's reason, as the rollout skips it."""

    driverless = driverless_node("a")
    with fake_agents() as agents:
        agents.add(driverless)
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        dry = invoke_process([*share, "--dry-run", *agents.args(), "-o", "json"], 60)
    assert dry.exit_code == 0, dry.output
    (preview,) = json.loads(dry.output)["previews"]
    assert preview["would"] == "skipped", preview
    assert "no module" in preview["detail"] and "valid here" not in preview["detail"], preview


def test_a_model_selector_keeps_a_node_whose_gpus_were_not_read() -> None:
    """`-l model=*H100*` dropped a node whose driver is not ready (its agent lists no GPU, so
    no model matched), while an unreachable node, which cannot say its model either, stays:
    `fleet status` did not list it and a rollout's dry run left it out. It stays (the dry
    run says it is skipped until its driver is ready)."""

    driverless = driverless_node("d")
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        agents.add(driverless)
        chosen = ["-l", "model=*H100*", *agents.args(), "-o", "json"]
        status = invoke_process(["fleet", "status", "--nodes", *chosen], 60)
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        dry = invoke_process([*share, "--dry-run", *chosen], 60)
    assert status.exit_code == 0, status.output
    assert [n["name"] for n in json.loads(status.output)["nodes"]] == ["a", "d"]
    previews = {p["node"]: p["would"] for p in json.loads(dry.output)["previews"]}
    assert previews == {"a": "change", "d": "skipped"}, previews


def test_an_incomplete_rollout_names_every_reason_not_only_the_last() -> None:
    """One node skipped for a failed GPU, one whose allocation mode allows no MIG change, one
    that does not answer: the error said only the allocation mode (each reason replaced the
    one before). It names each, with its nodes."""
    from agent._proto.gpuagent.v1 import agent_pb2

    failed = node("a", mark("failed", "XID 48 (double-bit ECC error)", "reset-gpu"))
    dynamic = node("b", mark("healthy"))
    failed.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    dynamic.allocation.mode = agent_pb2.ALLOCATION_MODE_DRA_DYNAMIC_MIG
    with fake_agents() as agents:
        agents.add(failed)
        agents.add(dynamic)
        gone = f"unix:{agents.root / 'gone.sock'}"
        address = ",".join([*(a.address for a in agents.agents.values()), gone])
        mig = agents.root / "mig.yaml"
        mig.write_text(
            "version: v1\nmig-configs:\n  whole:\n  - {devices: all, mig-enabled: false}\n"
        )
        args = ["--agents", address, "--insecure", "--max-unavailable", "3"]
        result = invoke_process(["fleet", "apply", "mig", "-f", str(mig), *args], 60)
    assert result.exit_code == 10, result.output
    error = result.output.split("error: ")[-1]
    assert "skipped for a failed GPU (a)" in error, error
    assert "allocation mode allows no MIG change (b)" in error, error
    assert f"did not answer ({gone})" in error, error


def test_an_agent_given_twice_is_one_node_and_two_agents_as_one_node_are_refused() -> None:
    """`--agents A,A` (or one socket by two paths) counted the node twice: '2 node(s), 16
    GPU(s)' for one node of 8, and a rollout would have dialled it as two. The same address is
    one agent; two addresses answering as one node are refused naming both."""
    with fake_agents() as agents:
        a = agents.add(node("a", mark("healthy"))).address
        twice = invoke_process(["fleet", "status", "--agents", f"{a},{a}", "--insecure"], 60)
        other = f"unix:{agents.root}/../{agents.root.name}/a.sock"
        aliased = invoke_process(["fleet", "status", "--agents", f"{a},{other}", "--insecure"], 60)
    assert twice.exit_code == 0, twice.output
    assert "1 node(s), 1 answering; 1 GPU(s)" in twice.output, twice.output
    assert aliased.exit_code == 2, aliased.output
    assert a in aliased.output and other in aliased.output and "node a" in aliased.output


def test_a_rollout_skips_a_node_whose_driver_is_not_ready_as_it_skips_a_failed_gpu() -> None:
    """A node whose driver is away (a GPU Operator driver upgrade) was changed like any other:
    its agent refused (DriverNotReady), the node failed, and at max-failures 1 the rollout
    halted before the healthy nodes. It is skipped and left pending with the driver's reason,
    for a resume once the driver is back; the others are changed."""
    import grpc

    driverless = driverless_node("a")
    refused = (grpc.StatusCode.FAILED_PRECONDITION, "share set needs the GPUs: no module")
    with fake_agents() as agents:
        agents.add(driverless, errors={"SharingService/SetSharing": refused})
        b = agents.add(node("b", mark("healthy")))
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        result = invoke_process([*share, *agents.args(), "-o", "json"], 60)
        table = invoke_process([*share, *agents.args()], 60)
        changed = b.calls.count("SharingService/SetSharing")
    assert result.exit_code == 10, result.output
    nodes = json.loads(result.output.split("\nerror:")[0])["record"]["nodes"]
    assert nodes["a"]["state"] == "pending" and "no module" in nodes["a"]["detail"], nodes
    assert nodes["b"]["state"] == "succeeded" and changed == 2, nodes
    assert "Skipped (driver not ready): a: " in table.output, table.output
    assert "skipped until their driver is ready (a)" in table.output, table.output


def test_a_plan_node_outside_the_selector_is_left_out_not_called_unanswering() -> None:
    """`fleet apply mig --plan plan.yaml -l name=a` on a plan of a and b: b, which the
    selector leaves out on purpose, was kept as a node no agent answers as (`unknown`, and
    `skipped: the agent did not answer` in a rollout). Only a plan node the fleet lacks is."""
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        agents.add(node("b", mark("healthy")))
        plan = _plan(agents.root / "ab.yaml", "a", "b", "z")
        args = ["--plan", str(plan), "--dry-run", *agents.args(), "-o", "json"]
        only_a = invoke_process(["fleet", "apply", "mig", *args, "-l", "name=a"], 60)
        not_b = invoke_process(["fleet", "apply", "mig", *args, "-l", "name!=b"], 60)
    for dry, shown in ((only_a, ["a"]), (not_b, ["a", "z"])):
        assert dry.exit_code == 0, dry.output
        assert sorted(p["node"] for p in json.loads(dry.output)["previews"]) == shown


def test_a_sharing_dry_run_on_a_node_whose_allocation_mode_is_unknown_is_unknown() -> None:
    """The agent refuses every sharing change (Conflict) until it knows whether a device plugin
    or a DRA driver hands out its GPUs; the preview said `change` there, a yes the apply then
    turned into a failure. It is `unknown`, naming the mode and its evidence."""
    from agent._proto.gpuagent.v1 import agent_pb2

    undecided = node("a", mark("healthy"))
    undecided.allocation.CopyFrom(
        agent_pb2.Allocation(
            mode=agent_pb2.ALLOCATION_MODE_UNSPECIFIED, evidence="API server not answering"
        )
    )
    with fake_agents() as agents:
        agents.add(undecided)
        agents.add(node("b", mark("healthy")))
        share = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
        dry = invoke_process([*share, "--dry-run", *agents.args(), "-o", "json"], 60)
    assert dry.exit_code == 0, dry.output
    previews = {p["node"]: p for p in json.loads(dry.output)["previews"]}
    assert previews["a"]["would"] == "unknown", previews
    assert "API server not answering" in previews["a"]["detail"], previews["a"]
    assert previews["b"]["would"] == "change", previews
