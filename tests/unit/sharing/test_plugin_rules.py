"""Rules the device plugin enforces at start-up, enforced here before anything is written
(docs/sharing.md, "The rules, and why"; k8s-device-plugin paths cited there)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import sharing_pb2
from agent.config import SharingSettings
from agent.errors import InvalidSpec
from agent.gpu.types import GpuLayout
from agent.sharing import parse
from agent.sharing.service import SharingService
from agent.sharing.validate import violations
from agent.wire.sharing import sharing_view_pb
from tests.unit.sharing.layouts import full_gpu, node


def check(doc: dict[str, object], layouts: list[GpuLayout]) -> dict[str, str]:
    return {v.field: v.description for v in violations(parse(doc), layouts)}


def mps(replicas: int) -> dict[str, object]:
    return {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def ts(replicas: int, **top: object) -> dict[str, object]:
    resource = {"name": "nvidia.com/gpu", "replicas": replicas}
    doc: dict[str, object] = {"sharing": {"timeSlicing": {"resources": [resource]}}}
    doc.update(top)
    return doc


def with_capability(layout: GpuLayout, cc: tuple[int, int] | None) -> GpuLayout:
    return dataclasses.replace(layout, gpu=dataclasses.replace(layout.gpu, compute_capability=cc))


AT = "sharing.mps.resources[0].replicas"


def test_mps_replicas_up_to_the_plugins_client_limit_of_48_are_accepted() -> None:
    hopper = [with_capability(full_gpu(i), (9, 0)) for i in range(2)]
    assert check(mps(48), hopper) == {}
    assert "at most 48" in check(mps(49), hopper)[AT]


def test_mps_on_a_gpu_older_than_compute_capability_7_5_takes_16_clients() -> None:
    """cmd/mps-control-daemon/mps/device.go maxClients: 16 below 7.5, one old GPU decides."""
    layouts = [with_capability(full_gpu(0), (9, 0)), with_capability(full_gpu(1), (7, 0))]
    assert check(mps(16), layouts) == {}
    assert "at most 16" in check(mps(17), layouts)[AT]


def test_mps_limit_with_an_unknown_compute_capability_is_the_general_one() -> None:
    layouts = [with_capability(full_gpu(0), None)]
    assert check(mps(48), layouts) == {}
    assert AT in check(mps(49), layouts)


def test_replicas_whose_advertised_count_passes_uint32_are_refused() -> None:
    """8 GPUs x 2**29 replicas = 2**32: the kubelet's and our API's counts cannot hold it."""
    found = check(ts(2**29), node(8))
    assert "uint32" in found["sharing.timeSlicing.resources[0].replicas"]
    assert check(ts(2**29 - 1), node(8)) == {}


@pytest.mark.parametrize("ids", [[1], [0, 1], [True], [0.0], "0", {"a": 0}])
def test_imex_channel_ids_other_than_empty_or_zero_are_refused(ids: object) -> None:
    """api/config/v1/imex.go AssertChannelIDsValid: "channelIDs must be [] or [0]"."""
    found = check(ts(2, imex={"channelIDs": ids}), node(1))
    assert "must be [] or [0]" in found["imex.channelIDs"]


def test_imex_channel_ids_empty_or_zero_and_required_are_accepted() -> None:
    assert check(ts(2, imex={"channelIDs": [0], "required": True}), node(1)) == {}
    assert check(ts(2, imex={"channelIDs": []}), node(1)) == {}
    assert list(check(ts(2, imex={"channelID": [0]}), node(1))) == ["imex.channelID"]


@pytest.mark.parametrize(
    ("plugin", "field"),
    [
        ({"deviceIDStrategy": "serial"}, "flags.plugin.deviceIDStrategy"),
        ({"deviceListStrategy": "mounts"}, "flags.plugin.deviceListStrategy"),
        ({"deviceListStrategy": ["envvar", "cdi"]}, "flags.plugin.deviceListStrategy[1]"),
        ({"sharedDevicesAllocationPolicy": "spread"}, "flags.plugin.sharedDevicesAllocationPolicy"),
    ],
)
def test_plugin_flag_values_the_plugin_refuses_are_refused(
    plugin: dict[str, object], field: str
) -> None:
    """cmd/nvidia-device-plugin/main.go validateFlags refuses to start with these."""
    assert list(check(ts(2, flags={"plugin": plugin}), node(1))) == [field]


def test_plugin_flag_values_the_plugin_takes_are_accepted() -> None:
    plugin = {
        "deviceIDStrategy": "index",
        "deviceListStrategy": ["envvar", "cdi-cri"],
        "sharedDevicesAllocationPolicy": "packed",
    }
    assert check(ts(2, flags={"plugin": plugin, "deviceDiscoveryStrategy": "nvml"}), node(1)) == {}


@pytest.mark.parametrize("key", ["renameByDefault", "failRequestsGreaterThanOne", "resources"])
def test_sharing_keys_misplaced_under_flags_are_refused(key: str) -> None:
    """The plugin's Flags type has no such field and its YAML reader drops it without a word."""
    found = check(ts(2, flags={key: True}), node(1))
    assert "misplaced" in found[f"flags.{key}"]


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    d = tmp_path / "plugin"
    d.mkdir()
    return d / "config.yaml"


def service(path: Path) -> SharingService:
    return SharingService(SharingSettings(config_path=path, reload="none"), lambda: node(8))


@pytest.mark.usefixtures("plugin_loaded")
def test_a_refused_set_over_uint32_writes_nothing_and_show_keeps_working(
    config_path: Path,
) -> None:
    svc = service(config_path)
    with pytest.raises(InvalidSpec):
        svc.set(parse(ts(2**31)))
    assert list(config_path.parent.iterdir()) == []
    view = sharing_view_pb(svc.show())
    assert view.config.strategy == sharing_pb2.SHARING_STRATEGY_NONE
    assert [(a.resource, a.count) for a in view.advertised] == [("nvidia.com/gpu", 8)]


@pytest.mark.usefixtures("plugin_loaded")
def test_a_hand_written_file_past_the_rules_still_shows_with_its_problems(
    config_path: Path,
) -> None:
    """Nothing the agent writes gets there, but a person may: show saturates, never fails."""
    config_path.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {2**40}\n"
    )
    view = sharing_view_pb(service(config_path).show())
    assert view.advertised[0].count == 2**32 - 1
    assert any("uint32" in p.description for p in view.problems)


@pytest.mark.usefixtures("plugin_loaded")
@pytest.mark.parametrize("replicas", [2**31, 2**40])
def test_a_count_past_uint32_reads_saturated_through_the_api_and_the_cli(
    config_path: Path, replicas: int
) -> None:
    """The API saturates a count past 2**32-1, but the client recomputed it from devices and
    replicas, so `share show` (which reads the agent's API) printed 17179869184 for a
    hand-written 2**31 replicas on 8 GPUs, in the table and in -o json, against the doc's
    promise. The count now reads saturated on both sides (docs/sharing.md, "The rules, and
    why")."""
    import json

    from click.testing import CliRunner

    from agent.cli.share import share
    from agent.wire.sharing import sharing_view_from

    config_path.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
    through_api = sharing_view_from(sharing_view_pb(service(config_path).show()))
    assert [a.count for a in through_api.advertised] == [2**32 - 1]

    class Remote:
        def sharing_service(self) -> Remote:
            return self

        def show(self) -> object:
            return through_api

    table = CliRunner().invoke(share, ["show"], obj=Remote())
    row = next(line for line in table.stdout.splitlines() if line.startswith("nvidia.com/gpu"))
    assert row.split()[-1] == str(2**32 - 1), table.stdout
    data = json.loads(CliRunner().invoke(share, ["show", "-o", "json"], obj=Remote()).stdout)
    assert data["advertised"][0]["count"] == 2**32 - 1
