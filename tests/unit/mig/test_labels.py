"""The node-label protocol (mig-manager's): a label names a config, the agent applies it.

The Kubernetes API is the suite's fake server over real HTTPS (no API server runs here); the GPUs
are a simulated node; the MIG service is the real one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kube import InClusterKubeClient
from agent.mig.labels import (
    CONFIG_LABEL,
    PAUSED,
    STATE_LABEL,
    MigLabelController,
    MigStateCollector,
    Outcome,
    due,
    pause_patch,
    restore_patch,
)
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.mig.simnode import SimNode, sim_node

CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 3}
"""

DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm-exporter"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = sim_node(tmp_path / "state", "dgx-h100")
    yield n
    n.close()


@pytest.fixture
def controller(
    node: SimNode, kube: InClusterKubeClient, tmp_path: Path
) -> tuple[MigLabelController, Clock]:
    config = tmp_path / "mig.yaml"
    config.write_text(CONFIG)
    clock = Clock()
    return MigLabelController(kube, NODE, node.service, config, clock=clock), clock


def test_pause_keeps_false_and_restore_touches_only_what_was_paused() -> None:
    labels = {DEVICE_PLUGIN: "true", DCGM: "false", "other": "true"}
    assert pause_patch(labels) == {DEVICE_PLUGIN: PAUSED}
    assert restore_patch({DEVICE_PLUGIN: PAUSED, DCGM: "false"}) == {DEVICE_PLUGIN: "true"}


def test_work_is_due_on_a_new_config_and_on_a_failed_one_after_back_off() -> None:
    assert due("a", None, 0, 300)
    assert not due(None, None, 0, 300)
    assert not due("a", Outcome("a", "success", "", 0), 10_000, 300)
    assert due("b", Outcome("a", "success", "", 0), 1, 300)
    assert not due("a", Outcome("a", "failed", "", 0), 299, 300)
    assert due("a", Outcome("a", "failed", "", 0), 300, 300)


def test_a_label_change_applies_the_config_pauses_operands_and_restores_them(
    controller: tuple[MigLabelController, Clock],
    kube_api: tuple[FakeKubeApi, str],
    node: SimNode,
) -> None:
    ctl, _ = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "all-balanced", DEVICE_PLUGIN: "true", DCGM: "false"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "success", outcome
    labels = api.nodes[NODE]
    assert labels[STATE_LABEL] == "success"
    assert labels[DEVICE_PLUGIN] == "true" and labels[DCGM] == "false"
    patches = [r.body for r in api.requests if r.method == "PATCH"]
    seen = [p["metadata"]["labels"] for p in patches]  # type: ignore[index]
    assert {STATE_LABEL: "pending", DEVICE_PLUGIN: PAUSED} in seen, "operands not paused"
    layout = node.driver.layout(node.driver.gpus()[0].uuid)
    assert sorted(gi.profile_name for gi in layout.instances) == [
        "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"
    ]  # fmt: skip
    assert ctl.reconcile() is None, "an unchanged label must not reapply"


def test_a_failed_config_still_restores_operands_and_is_retried_after_back_off(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    ctl, clock = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "too-many", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed"
    assert api.nodes[NODE][STATE_LABEL] == "failed"
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"
    assert ctl.reconcile() is None
    clock.now += 301
    retried = ctl.reconcile()
    assert retried is not None and retried.state == "failed"


def test_an_unknown_config_name_fails_without_pausing_anything(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    ctl, _ = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "no-such-config", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed"
    assert "no-such-config" in outcome.message
    seen = [r.body["metadata"]["labels"] for r in api.requests if r.method == "PATCH"]  # type: ignore[index]
    assert all(DEVICE_PLUGIN not in p for p in seen)


def test_an_already_applied_config_only_reports_success(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    ctl, _ = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "all-disabled", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and (outcome.state, outcome.message) == (
        "success",
        "already applied",
    )
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"


def test_the_state_is_exported_for_alerts(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    """gpu_agent_mig_config_state mirrors nvidia.com/mig.config.state (the MIG-failed alert)."""
    ctl, _ = controller
    api, _ = kube_api
    collector = MigStateCollector(ctl)
    assert [m.samples for m in collector.collect()] == [[]]
    api.nodes[NODE][CONFIG_LABEL] = "too-many"
    ctl.reconcile()
    (family,) = collector.collect()
    values = {s.labels["state"]: s.value for s in family.samples}
    assert family.name == "gpu_agent_mig_config_state"
    assert values == {"pending": 0.0, "success": 0.0, "failed": 1.0}
    assert {s.labels["config"] for s in family.samples} == {"too-many"}
