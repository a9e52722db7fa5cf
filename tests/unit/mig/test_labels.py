"""The node-label protocol (mig-manager's): a label names a config, the agent applies it.

The Kubernetes API is the suite's fake server over real HTTPS (no API server runs here); the GPUs
are a simulated node; the MIG service is the real one.
"""

from __future__ import annotations

import itertools
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
from agent.mig.spec import parse_spec
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
  a100-1g:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"""

DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm-exporter"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"


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


def test_a_lost_gpu_the_config_selects_is_failed_not_success(
    controller: tuple[MigLabelController, Clock],
    kube_api: tuple[FakeKubeApi, str],
    node: SimNode,
) -> None:
    """The other GPUs are applied; the state says failed, naming the lost GPU (mig-manager's
    apply fails on its NVML error), and the operands are put back."""
    ctl, _ = controller
    api, _ = kube_api
    node.control.mark_lost(3)
    api.nodes[NODE].update({CONFIG_LABEL: "all-balanced", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed", outcome
    assert "GPU 3 is lost (" in outcome.message and "not applied" in outcome.message
    assert api.nodes[NODE][STATE_LABEL] == "failed"
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"
    layout = node.driver.layout(node.driver.gpus()[0].uuid)
    assert len(layout.instances) == 4  # the GPUs that answer were applied

    # Retried after its back-off: every GPU that answers holds it, so nothing is paused for
    # an apply that could change nothing; still failed, never "already applied".
    ctl, clock = controller
    patches = sum(r.method == "PATCH" for r in api.requests)
    clock.now += 301
    again = ctl.reconcile()
    assert again is not None and again.state == "failed", again
    assert "GPU 3 is lost: whether it holds all-balanced cannot be read" in again.message
    paused = [
        r.body for r in api.requests[patches:] if r.method == "PATCH" and "pending" in str(r.body)
    ]
    assert paused == []


def test_a_config_that_cannot_fit_fails_without_pausing_and_waits_for_a_label_change(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    """Issue 20: no pause/restore of the device plugin, GFD and DCGM every 300 s."""
    ctl, clock = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "too-many", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed"
    assert "3g.40gb" in outcome.message, outcome.message  # the plan's reason
    assert api.nodes[NODE][STATE_LABEL] == "failed"
    for _ in range(4):  # 20 minutes of passes
        clock.now += 301
        assert ctl.reconcile() is None
    assert PAUSED not in _patched_values(api), "paused for a config that cannot apply"
    api.nodes[NODE][CONFIG_LABEL] = "all-balanced"
    assert (ctl.reconcile() or Outcome("", "", "", 0)).state == "success"


def test_a_failed_apply_restores_operands_and_is_retried_after_back_off(
    controller: tuple[MigLabelController, Clock],
    kube_api: tuple[FakeKubeApi, str],
    node: SimNode,
) -> None:
    ctl, clock = controller
    api, _ = kube_api
    node.control.inject_fault("nvmlGpuInstanceCreateComputeInstance", "Unknown", nth=3)
    api.nodes[NODE].update({CONFIG_LABEL: "all-balanced", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed" and "rolled back" in outcome.message
    assert api.nodes[NODE][STATE_LABEL] == "failed"
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"
    assert PAUSED in _patched_values(api)  # it was paused for the apply, and put back
    assert ctl.reconcile() is None
    clock.now += 301
    retried = ctl.reconcile()
    assert retried is not None and retried.state == "success"


def test_processes_in_the_way_fail_without_pausing_and_are_retried(
    controller: tuple[MigLabelController, Clock],
    kube_api: tuple[FakeKubeApi, str],
    node: SimNode,
) -> None:
    ctl, clock = controller
    api, _ = kube_api
    spec = parse_spec(CONFIG)
    node.service.apply(spec, "all-balanced")
    node.control.start_process(4242, 0, used_memory_mib=512, gpu_instance=_gi_of(node, "2g.20gb"))
    api.nodes[NODE].update({CONFIG_LABEL: "all-disabled", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed" and "4242" in outcome.message
    assert PAUSED not in _patched_values(api)
    node.control.stop_process(4242)
    clock.now += 301
    assert (ctl.reconcile() or Outcome("", "", "", 0)).state == "success"
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"


def test_a_failed_restore_patch_is_retried_with_back_off_until_it_lands(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    """Issue 20: one failed restore PATCH left the device plugin paused for good."""
    ctl, clock = controller
    api, _ = kube_api
    api.nodes[NODE].update({CONFIG_LABEL: "all-balanced", DEVICE_PLUGIN: "true"})
    # The pause lands; the restore after the apply, and the next three tries, fail.
    api.failing[("PATCH", f"/api/v1/nodes/{NODE}")] = (1, 4)
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "success"
    assert api.nodes[NODE][DEVICE_PLUGIN] == PAUSED  # the restore PATCH failed
    tries = []
    for _ in range(240):  # 20 minutes of 5 s passes
        clock.now += 5
        before = len([r for r in api.requests if r.method == "PATCH"])
        ctl.reconcile()
        tries.append(len([r for r in api.requests if r.method == "PATCH"]) - before)
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true"
    assert api.nodes[NODE][STATE_LABEL] == "success"
    assert sum(tries) == 4, tries  # 3 more failures, then the one that lands; none after
    first_tries = [i for i, n in enumerate(tries) if n]
    gaps = [b - a for a, b in itertools.pairwise(first_tries)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0], f"no back-off: {first_tries}"


def test_a_restart_with_operands_paused_and_the_config_applied_restores_them(
    node: SimNode, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], tmp_path: Path
) -> None:
    api, _ = kube_api
    (tmp_path / "mig.yaml").write_text(CONFIG)
    node.service.apply(parse_spec(CONFIG), "all-balanced")
    # What the agent killed right after its apply, before its restore, left on the node.
    api.nodes[NODE].update(
        {CONFIG_LABEL: "all-balanced", STATE_LABEL: "pending", DEVICE_PLUGIN: PAUSED, DCGM: "false"}
    )
    fresh = MigLabelController(kube, NODE, node.service, tmp_path / "mig.yaml", clock=Clock())
    outcome = fresh.reconcile()
    assert outcome is not None and (outcome.state, outcome.message) == (
        "success",
        "already applied",
    )
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true" and api.nodes[NODE][DCGM] == "false"
    assert api.nodes[NODE][STATE_LABEL] == "success"


def test_removing_the_config_label_restores_paused_operands(
    controller: tuple[MigLabelController, Clock], kube_api: tuple[FakeKubeApi, str]
) -> None:
    ctl, _ = controller
    api, _ = kube_api
    api.nodes[NODE].update({STATE_LABEL: "pending", DEVICE_PLUGIN: PAUSED, GFD: PAUSED})
    assert ctl.reconcile() is None
    assert api.nodes[NODE][DEVICE_PLUGIN] == "true" and api.nodes[NODE][GFD] == "true"


def test_a_mode_change_waiting_for_a_vm_reboot_is_rebooting_then_applied_after_it(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], tmp_path: Path
) -> None:
    api, _ = kube_api
    (tmp_path / "mig.yaml").write_text(CONFIG)
    a100 = sim_node(tmp_path / "a100", "dgx-a100")
    try:
        a100.control.set_passthrough_vm(True)
        api.nodes[NODE].update({CONFIG_LABEL: "a100-1g", DEVICE_PLUGIN: "true"})
        ctl = MigLabelController(kube, NODE, a100.service, tmp_path / "mig.yaml", clock=Clock())
        outcome = ctl.reconcile()
        assert outcome is not None and outcome.state == "rebooting", outcome
        assert "reboot" in outcome.message
        assert api.nodes[NODE][STATE_LABEL] == "rebooting"
        assert api.nodes[NODE][DEVICE_PLUGIN] == "true"  # serving the current layout meanwhile
        ctl.last = Outcome(
            outcome.config, outcome.state, outcome.message, -1e9, False, outcome.digest
        )
        assert ctl.reconcile() is None  # waits for the reboot, no retry loop
        a100.control.reboot()
        after = MigLabelController(kube, NODE, a100.service, tmp_path / "mig.yaml", clock=Clock())
        done = after.reconcile()  # the agent starts again after the reboot
        assert done is not None and done.state == "success", done
        assert api.nodes[NODE][STATE_LABEL] == "success"
    finally:
        a100.close()


def _patched_values(api: FakeKubeApi) -> set[str]:
    return {
        v
        for r in api.requests
        if r.method == "PATCH"
        for v in r.body["metadata"]["labels"].values()  # type: ignore[index]
    }


def _gi_of(node: SimNode, profile: str) -> int:
    layout = node.driver.layout(node.driver.gpus()[0].uuid)
    return next(gi.id for gi in layout.instances if gi.profile_name == profile)


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
    assert values == {"pending": 0.0, "success": 0.0, "failed": 1.0, "rebooting": 0.0}
    assert {s.labels["config"] for s in family.samples} == {"too-many"}


def test_a_dynamic_mig_node_fails_the_label_without_pausing_or_touching_a_gpu(
    node: SimNode, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], tmp_path: Path
) -> None:
    """Beside a DRA driver that makes MIG instances itself, the label protocol says why it
    does nothing, and neither pauses the operands nor changes a GPU (docs/dra.md)."""
    from agent.dra.mode import Allocation, AllocationMode
    from agent.mig.lock import PartitionLock
    from agent.mig.reset import simulated_reset
    from agent.mig.service import MigService

    api, _ = kube_api
    dynamic = Allocation(AllocationMode.DRA_DYNAMIC_MIG, "partitionable devices", "gpu.nvidia.com")
    service = MigService(
        node.driver,
        node.store,
        PartitionLock(node.state_dir),
        simulated_reset(node.state_dir),
        allocation=lambda: dynamic,
    )
    config = tmp_path / "mig.yaml"
    config.write_text(CONFIG)
    ctl = MigLabelController(kube, NODE, service, config, clock=Clock())
    before = node.states()
    api.nodes[NODE].update({CONFIG_LABEL: "all-balanced", DEVICE_PLUGIN: "true"})
    outcome = ctl.reconcile()
    assert outcome is not None and outcome.state == "failed"
    assert "allocation mode is dra-dynamic-mig" in outcome.message
    assert api.nodes[NODE][STATE_LABEL] == "failed"
    assert PAUSED not in _patched_values(api)
    assert node.states() == before
