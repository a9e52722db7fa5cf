"""`gpu-agent status` of a node whose process lists were withheld from the caller's roles."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import agent_pb2
from agent.cli.status import _table, status_view
from agent.wire.node import gpu_pb, node_from
from tests.unit.sharing.layouts import full_gpu, mig_gpu


def _node(hidden: bool) -> agent_pb2.Node:
    node = agent_pb2.Node(name="n", driver_version="550.90.07", processes_hidden=hidden)
    node.gpus.extend(gpu_pb(full_gpu(i)) for i in range(2))
    return node


def test_withheld_processes_are_shown_as_withheld_not_as_none_running() -> None:
    data = status_view(node_from(_node(hidden=True)))
    assert data["processes_withheld"] is True
    assert [g["processes"] for g in data["gpus"]] == [None, None]
    text = _table(data)
    assert "withheld (read role)" in text
    assert "  none" not in text
    assert len(data["gpus"]) == 2  # the GPUs themselves are not withheld


def test_a_node_without_processes_still_says_none() -> None:
    data = status_view(node_from(_node(hidden=False)))
    assert data["processes_withheld"] is False
    assert [g["processes"] for g in data["gpus"]] == [[], []]
    assert _table(data).endswith("Processes\n  none")


def test_a_lost_gpu_s_processes_are_not_read_not_none() -> None:
    """A lost GPU's processes were "[]" in JSON and "none" in the table: nobody read them."""
    node = _node(hidden=False)
    node.gpus[0].health = agent_pb2.GPU_HEALTH_LOST
    data = status_view(node_from(node))
    assert [g["processes"] for g in data["gpus"]] == [None, []]
    assert _table(data).endswith("Processes\n  none on the GPUs read\n  GPU 0: not read (lost)")


def test_health_marks_show_per_gpu_and_instance_with_reason_and_pods() -> None:
    node = _node(hidden=False)
    node.gpus[0].condition.CopyFrom(
        agent_pb2.HealthMark(
            state=agent_pb2.HEALTH_STATE_FAILED,
            reason="XID 79 (GPU has fallen off the bus): needs reboot-node",
            action="reboot-node",
            pods=["ml/train-0"],
        )
    )
    node.gpus[0].condition.since.FromSeconds(1_800_000_000)
    node.gpus[1].condition.CopyFrom(agent_pb2.HealthMark(state=agent_pb2.HEALTH_STATE_HEALTHY))
    data = status_view(node_from(node))
    assert data["gpus"][0]["condition"] == {
        "state": "failed",
        "reason": "XID 79 (GPU has fallen off the bus): needs reboot-node",
        "since": "2027-01-15T08:00:00+00:00",
        "action": "reboot-node",
        "pods": ["ml/train-0"],
    }
    text = _table(data)
    assert "failed (reboot-node)" in text and "healthy" in text
    assert (
        "GPU 0 failed since 2027-01-15T08:00:00+00:00: XID 79 (GPU has fallen off the bus): "
        "needs reboot-node (pods: ml/train-0)"
    ) in text
    node.gpus[1].ClearField("condition")
    assert status_view(node_from(node))["gpus"][1]["condition"] is None  # not judged yet


def test_status_shows_the_allocation_mode_with_its_evidence() -> None:
    node = _node(hidden=False)
    node.allocation.CopyFrom(
        agent_pb2.Allocation(
            mode=agent_pb2.ALLOCATION_MODE_DRA,
            evidence="ResourceSlices of gpu.nvidia.com on this node list 2 device(s) (2 gpu)",
            dra_driver="gpu.nvidia.com",
        )
    )
    data = status_view(node_from(node))
    assert data["allocation"] == {
        "mode": "dra",
        "evidence": "ResourceSlices of gpu.nvidia.com on this node list 2 device(s) (2 gpu)",
        "driver": "gpu.nvidia.com",
    }
    assert "\nAllocation: dra (ResourceSlices of gpu.nvidia.com" in _table(data)
    # An agent from before the field: unknown, and said why (never shown as none).
    old = status_view(node_from(_node(hidden=False)))["allocation"]
    assert old["mode"] == "unknown" and "older version" in old["evidence"]


def test_without_a_driver_no_gpu_count_and_no_process_list_is_claimed() -> None:
    """`status` once said "Driver not ready, 0 GPU(s)" and "Processes none" when nothing had
    been read: a node without GPUs or processes, as far as a reader could tell."""
    node = agent_pb2.Node(name="n")
    node.driver.state = agent_pb2.DRIVER_STATE_NOT_READY
    node.driver.cause = "library_not_found"
    text = _table(status_view(node_from(node)))
    assert text.startswith("Driver not ready: GPUs not read")
    assert "0 GPU(s)" not in text and "  none" not in text and "GPU  HEALTH" not in text
    assert text.endswith("Processes\n  not read: the driver is not ready")


def test_a_lost_gpus_instances_are_said_to_be_as_last_read() -> None:
    """A lost GPU answers nothing: its MIG instances are the last layout read, not a live one."""
    node = agent_pb2.Node(name="n", driver_version="550.90.07")
    node.gpus.extend([gpu_pb(mig_gpu(0, "1g.10gb")), gpu_pb(mig_gpu(1, "1g.10gb"))])
    node.gpus[0].health = agent_pb2.GPU_HEALTH_LOST
    text = _table(status_view(node_from(node)))
    said = [line for line in text.splitlines() if "as last read" in line]
    assert said == ["GPU 0 is lost: its instances are as last read, before it stopped answering"]


def test_an_instances_compute_instance_ids_are_not_headed_as_a_count() -> None:
    """One CI with id 0 read `CIs 0`, as if the instance had none: the column names ids, as
    nvidia-smi's `CI ID` does."""
    node = agent_pb2.Node(name="n", driver_version="550.90.07")
    node.gpus.extend([gpu_pb(mig_gpu(0, "1g.10gb"))])
    header = next(ln for ln in _table(status_view(node_from(node))).splitlines() if "PROFILE" in ln)
    assert "  CI ID  " in header and "CIs" not in header


def test_a_gpu_lost_before_it_was_read_has_unknown_instances_not_none() -> None:
    """A GPU lost before the agent ever read it (only its index known) had `"instances": []`
    in `status -o json`, as a GPU with no MIG instance; its MIG mode was already null. Both
    are unknown now, and the table says so."""
    node = agent_pb2.Node(name="n", driver_version="550.90.07")
    node.gpus.extend([gpu_pb(mig_gpu(0, "1g.10gb"))])
    node.gpus.add(index=1, health=agent_pb2.GPU_HEALTH_LOST, health_detail="GPU is lost")
    data = status_view(node_from(node))
    assert [g["instances"] is None for g in data["gpus"]] == [False, True]
    assert data["gpus"][1]["mig"] is None
    assert "GPU 1 was never read: its memory, MIG mode and instances are unknown" in _table(data)
