"""After a MIG change on a device-plugin node the agent tells the device plugin (agent/mig/
service.py `_plugin_told`); whatever the plugin does, the applied layout stands and the result
says what happened."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.config import SharingSettings
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import PermissionDenied
from agent.mig.lock import PartitionLock
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import parse_spec
from agent.sharing.service import SharingService
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
