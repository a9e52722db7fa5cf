"""`fleet apply share --dry-run`: each node's sharing now and what the change would make of it,
for a spec and for a whole config file (-f) alike, as the agent's SetSharing would decide."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import agent_pb2, sharing_pb2
from agent.coordinator.rollout.actions import _preview_share, sharing_preview
from agent.sharing.schema import PluginConfig, parse, render
from agent.wire.node import NodeView, gpu_pb, node_from
from agent.wire.sharing import requested_config
from tests.unit.coordinator.fleets import H100, gpu

TS2 = """\
version: v1
flags: {migStrategy: none, failOnInitError: true}
sharing:
  timeSlicing:
    resources: [{name: nvidia.com/gpu, replicas: 2}]
"""


def _file(text: str) -> sharing_pb2.SetSharingRequest:
    return sharing_pb2.SetSharingRequest(config_yaml=text)


def _on_node(text: str) -> PluginConfig:
    """The config as the agent reports it (GetSharing renders the file it parsed)."""
    return parse(render(parse(text)))


LAYOUTS = [gpu("a", 0, mig=(False, False)), gpu("a", 1, mig=(False, False))]


def test_a_whole_file_shows_the_current_and_the_planned_sharing() -> None:
    wanted = requested_config(_file(TS2.replace("replicas: 2", "replicas: 4")))
    p = sharing_preview("a", wanted, _on_node(TS2), LAYOUTS)
    assert (p.would, p.current, p.planned) == (
        "change",
        "time-slicing nvidia.com/gpu x2 (migStrategy none)",
        "time-slicing nvidia.com/gpu x4 (migStrategy none)",
    )
    assert p.detail == (
        "now: time-slicing nvidia.com/gpu x2 (migStrategy none); "
        "planned: time-slicing nvidia.com/gpu x4 (migStrategy none) "
        "(changes sharing.timeSlicing.resources)"
    )


def test_the_same_file_again_is_unchanged() -> None:
    p = sharing_preview("a", requested_config(_file(TS2)), _on_node(TS2), LAYOUTS)
    assert (p.would, p.detail) == (
        "unchanged",
        "now: time-slicing nvidia.com/gpu x2 (migStrategy none)",
    )


def test_a_file_without_flags_keeps_the_nodes_flags_as_the_agent_does() -> None:
    """SetSharing lays the request over the node's file: flags it leaves out stay."""
    bare = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n"
    p = sharing_preview("a", requested_config(_file(bare)), _on_node(TS2), LAYOUTS)
    assert p.would == "unchanged"


def test_a_node_without_a_config_file_and_a_spec() -> None:
    spec = sharing_pb2.SetSharingRequest(
        spec=sharing_pb2.SharingSpec(
            strategy=sharing_pb2.SHARING_STRATEGY_MPS,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=3)],
        )
    )
    p = sharing_preview("a", requested_config(spec), None, LAYOUTS)
    assert (p.would, p.current, p.planned) == (
        "change",
        "none (no config file)",
        "mps nvidia.com/gpu x3",
    )
    assert "changes sharing" in p.detail


def test_a_config_the_agent_would_refuse_is_shown_refused() -> None:
    wanted = requested_config(_file(TS2.replace("replicas: 2", "replicas: 1")))
    p = sharing_preview("a", wanted, _on_node(TS2), LAYOUTS)
    assert p.would == "refused"
    assert "sharing.timeSlicing.resources[0].replicas" in p.detail


def _assert_mixed_refused(node: agent_pb2.Node) -> None:
    """nvidia.com/gpu under the mixed strategy, previewed for ``node`` (no config file yet):
    refused, as the agent's SetSharing refuses it when every GPU it counts has MIG on."""
    mixed = TS2.replace("migStrategy: none", "migStrategy: mixed")
    record = SimpleNamespace(
        spec={"request": {"configYaml": mixed}}, request_id=lambda node: f"r-{node}"
    )

    class Agent:
        async def get_sharing(self) -> SimpleNamespace:
            return SimpleNamespace(exists=False, config=None, dra=None, last_write=None)

        async def node(self) -> NodeView:
            return node_from(node)

    preview = asyncio.run(_preview_share(Agent(), record, "a"))  # type: ignore[arg-type]
    assert preview.would == "refused", preview.detail
    assert "under the mixed strategy the plugin advertises no nvidia.com/gpu" in preview.detail


def test_a_lost_gpu_is_not_among_the_gpus_the_config_is_checked_against() -> None:
    """GPUs 0 and 1 have MIG on; GPU 2 is lost. The agent's SetSharing checks the config against
    the GPUs that answer, so it refuses nvidia.com/gpu under the mixed strategy; the dry run
    counted GPU 2's blank layout as a whole GPU and said "change"."""
    node = agent_pb2.Node(name="a")
    node.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    for index in (0, 1):
        node.gpus.append(gpu_pb(gpu("a", index, H100, [("3g.40gb", 0), ("3g.40gb", 4)])))
    node.gpus.add(index=2, health=agent_pb2.GPU_HEALTH_LOST)
    _assert_mixed_refused(node)


def test_a_gpu_not_read_is_not_among_the_gpus_the_config_is_checked_against() -> None:
    """GPUs 0 and 1 have MIG on; GPU 2's MIG-mode read fails and GPU 3 was never read (not
    lost). The agent's SetSharing leaves them out as lost ones; the dry run counted them as
    whole GPUs and said "change" for nvidia.com/gpu under the mixed strategy."""
    node = agent_pb2.Node(name="a")
    node.allocation.mode = agent_pb2.ALLOCATION_MODE_DEVICE_PLUGIN
    for index in (0, 1):
        node.gpus.append(gpu_pb(gpu("a", index, H100, [("3g.40gb", 0), ("3g.40gb", 4)])))
    node.gpus.append(gpu_pb(gpu("a", 2, H100, mig=(False, False)), unread="nvmlDeviceGetMigMode"))
    node.gpus.add(index=3, unread="nvmlDeviceGetUUID: GPU requires reset", never_read=True)
    _assert_mixed_refused(node)


def test_a_dra_node_is_previewed_as_its_agent_decides_there() -> None:
    """On a DRA node the agent's SetSharing renders the spec as DeviceClasses (`dra.plan`), not
    the plugin's file: --rename is refused there and the plugin's rules do not apply. The dry
    run checked every node as a device-plugin node, so it said "change" for a spec the DRA
    node refuses. It now decides as that node's agent does (docs/coordinator.md, "Rollouts")."""
    from pathlib import Path

    from agent.dra.mode import Allocation, AllocationMode
    from agent.sharing.view import DraObject, DraView, Pickup, SharingView

    dra = Allocation(AllocationMode.DRA, "ResourceSlices of gpu.nvidia.com", "gpu.nvidia.com")
    set_here = parse(TS2.replace("flags: {migStrategy: none, failOnInitError: true}\n", ""))

    def view(config: PluginConfig, state: str) -> SharingView:
        objects = (DraObject("DeviceClass", "gpu-agent-time-slicing-gpu", state, {}),)
        return SharingView(
            Path("/etc/nvidia-device-plugin/config.yaml.dra"),
            True,
            config,
            (),
            (),
            Pickup("unknown", ""),
            None,
            DraView(dra, objects),
        )

    def preview(wanted: sharing_pb2.SharingSpec, now: SharingView) -> object:
        record = SimpleNamespace(
            spec={"request": {"spec": json_format.MessageToDict(wanted)}},
            request_id=lambda node: f"r-{node}",
        )

        class Agent:
            async def get_sharing(self) -> SharingView:
                return now

            async def node(self) -> NodeView:
                return node_from(agent_pb2.Node(name="a", gpus=[gpu_pb(g) for g in LAYOUTS]))

        return asyncio.run(_preview_share(Agent(), record, "a"))  # type: ignore[arg-type]

    ts = sharing_pb2.SHARING_STRATEGY_TIME_SLICING
    gpu2 = [sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=2)]
    renamed = sharing_pb2.SharingSpec(strategy=ts, resources=gpu2, rename_by_default=True)
    refused = preview(renamed, view(set_here, "present"))
    assert refused.would == "refused", refused.detail
    assert "sharing.timeSlicing.renameByDefault: no DRA equivalent" in refused.detail
    same = sharing_pb2.SharingSpec(strategy=ts, resources=gpu2)
    assert preview(same, view(set_here, "present")).would == "unchanged"
    assert preview(same, view(set_here, "missing")).would == "change"  # set makes it again
    # A class edited by hand: the agent refuses to overwrite it (dra.reconcile_one).
    edited = preview(same, view(set_here, "differs"))
    assert edited.would == "refused", edited.detail
    assert "DeviceClass gpu-agent-time-slicing-gpu was edited" in edited.detail
    assert "kubectl delete deviceclass" in edited.detail
    more = sharing_pb2.SharingSpec(
        strategy=sharing_pb2.SHARING_STRATEGY_MPS,
        resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=4)],
    )
    changed = preview(more, view(set_here, "present"))
    assert (changed.would, changed.planned) == ("change", "mps nvidia.com/gpu x4")
