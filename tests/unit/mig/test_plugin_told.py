"""After a MIG change on a device-plugin node the agent tells the device plugin (agent/mig/
service.py `_plugin_told`); whatever the plugin does, the applied layout stands and the result
says what happened."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.config import SharingSettings
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import PermissionDenied
from agent.kube import InClusterKubeClient
from agent.mig.lock import PartitionLock
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import parse_spec
from agent.sharing.service import SharingService
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.mig.simnode import sim_node

CONFIG = parse_spec(
    "version: v1\nmig-configs:\n  halves:\n    - devices: [0]\n      mig-enabled: true\n"
    "      mig-devices: {3g.40gb: 2}\n"
)


def _apply(tmp_path: Path, tell: Callable[[], str]) -> str:
    node = sim_node(tmp_path, "dgx-h100")
    try:
        service = MigService(
            node.driver,
            node.store,
            PartitionLock(tmp_path),
            simulated_reset(tmp_path),
            allocation=lambda: Allocation(AllocationMode.DEVICE_PLUGIN, "test"),
            tell_plugin=tell,
        )
        result = service.apply(CONFIG, "halves")
        assert [g.status for g in result.gpus] == ["applied"]  # the layout stands regardless
        return result.device_plugin
    finally:
        node.close()


def test_a_plugin_that_cannot_be_told_is_said_not_raised(tmp_path: Path) -> None:
    def refuse() -> str:
        raise PermissionDenied("not allowed to signal nvidia-device-plugin (pid 7)")

    said = _apply(tmp_path, refuse)
    assert said == "not reloaded: not allowed to signal nvidia-device-plugin (pid 7)"


def test_reload_label_says_it_cannot_restart_the_plugin_for_a_mig_change(tmp_path: Path) -> None:
    """config-manager acts only on a change of its label; re-setting it would switch configs."""
    settings = SharingSettings(config_path=tmp_path / "dp" / "config.yaml", reload="label")
    sharing = SharingService(settings, lambda: ())
    said = _apply(tmp_path / "node", sharing.reload_for_mig_change)
    assert said.startswith("not reloaded: reload label switches configs")
    assert "nvidia.com/mig.config" in said


def test_reload_restart_pod_deletes_the_plugin_pod_after_a_mig_change(
    tmp_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """README: the plugin is told at once, by SIGHUP or a pod restart; with reload
    restart-pod, this node's plugin pod is deleted (its DaemonSet starts a fresh one, which
    enumerates the new MIG devices) and the result names it."""
    api, _ = kube_api
    settings = SharingSettings(config_path=tmp_path / "dp" / "config.yaml", reload="restart-pod")
    sharing = SharingService(settings, lambda: (), kube, node_name=NODE)
    said = _apply(tmp_path / "node", sharing.reload_for_mig_change)
    assert "nvidia-device-plugin-daemonset-abcde" in said
    assert not said.startswith("not reloaded")
    assert [p.name for p in api.pods if p.node == NODE] == ["gpu-feature-discovery-klmno"]


def test_mig_apply_says_what_the_plugin_was_told(tmp_path: Path) -> None:
    """README: "the apply says so". ``gpu-agent mig apply`` on a device-plugin node prints the
    agent's word on the plugin, carried from the MIG service through the gRPC API (the
    command's embedded agent serves it over its socket) to the CLI's ``Device plugin:`` line."""
    config = tmp_path / "mig.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  halves:\n    - devices: [0]\n      mig-enabled: true\n"
        "      mig-devices: {3g.40gb: 2}\n"
    )
    env = {"GPU_AGENT_SIMULATE_LATENCY": "false", "GPU_AGENT_DRA__MODE": "device-plugin"}
    obj = CliContext(None, {"simulate": "dgx-h100", "state_dir": tmp_path / "node"}, env=env)
    try:
        result = CliRunner().invoke(mig, ["apply", "-f", str(config), "-c", "halves"], obj=obj)
    finally:
        obj.close()
    assert result.exit_code == 0, result.output
    # No device plugin process runs on the simulated node: the apply says it was not reloaded.
    assert "Device plugin: not reloaded: no process named nvidia-device-plugin" in result.output
