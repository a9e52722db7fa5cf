"""The allocation mode on a running agent (simulated node + the API stand-in + the fake DRA
kubelet plugin): detected and shown, and what it lets the agent change (docs/dra.md).

* dra-dynamic-mig: every MIG change is refused naming the mode, and nothing on the GPUs
  changes, not even the start-up recovery of a MIG journal;
* dra: an apply succeeds only once the driver republished exactly the new devices; a driver
  that never republishes makes the apply roll back and say why;
* unknown (an API that does not answer): MIG changes are refused naming that, CLI exit 12.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from agent.client.sync import AgentClient
from agent.dra.mode import AllocationMode
from agent.errors import AgentError, Conflict, ModeRefused
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.kube import InClusterKubeClient
from agent.mig.checkpoint import checkpoint_document
from agent.mig.journal import SCOPE, begin_entry
from agent.mig.lock import PartitionLock
from agent.mig.node_plan import desired_of
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import parse_spec
from agent.mig.state import fetch
from agent.state import StateStore
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fake_dra_plugin import DRIVER, FakeDraPlugin
from tests.kube.fixtures import NODE
from tests.unit.api.support import REPO, InProcessAgent, agent_config, wait_for

pytestmark = pytest.mark.integration

CONFIG = """\
version: v1
mig-configs:
  gpu0-1g:
    - {devices: [0], mig-enabled: true, mig-devices: {1g.10gb: 7}}
    - {devices: [1, 2, 3, 4, 5, 6, 7], mig-enabled: false}
  gpu0-3g:
    - {devices: [0], mig-enabled: true, mig-devices: {3g.40gb: 2}}
    - {devices: [1, 2, 3, 4, 5, 6, 7], mig-enabled: false}
"""

#: GPU 0 only: a config that leaves GPU 7 (unread in a test) out
ONLY_GPU_0 = """\
version: v1
mig-configs:
  gpu0-1g:
    - {devices: [0], mig-enabled: true, mig-devices: {1g.10gb: 7}}
"""


@pytest.fixture
def node_api(
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> FakeKubeApi:
    """The agent's Kubernetes client is the stand-in's; the simulated node exists already
    (the DRA plugin reads it before the agent starts, as on a booted node)."""
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    open_driver("dgx-h100", tmp_path / "state").close()
    return kube_api[0]


def gpus(state: Path) -> list[dict[str, Any]]:
    """What the simulated GPUs hold (workloads left out: they move on their own)."""
    return [
        {k: v for k, v in g.items() if k not in ("workload", "power_limit_w")}
        for g in SimControl(state).describe()["gpus"]
    ]


def slice_uuids(api: FakeKubeApi) -> list[str]:
    return sorted(
        d["attributes"]["uuid"]["string"]
        for s in api.dra("resourceslices")
        if s["spec"]["nodeName"] == NODE
        for d in s["spec"]["devices"]
        if "uuid" in d["attributes"]
    )


def nvml_uuids(state: Path) -> list[str]:
    found = []
    for g in SimControl(state).describe()["gpus"]:
        if g["mig"]["current"]:
            found += [ci["uuid"] for gi in g["gpu_instances"] for ci in gi["compute_instances"]]
        else:
            found.append(g["uuid"])
    return sorted(found)


def start(tmp_path: Path, **dra: Any) -> InProcessAgent:
    root = tmp_path
    return InProcessAgent(root, agent_config(root, node_name=NODE, dra=dra))


def settled(client: AgentClient, mode: AllocationMode, within: float = 30) -> Any:
    """The node once its allocation mode is ``mode``. The start waits ALLOCATION_SYNC_S (3 s)
    for the first list of what the mode is read from and serves with the mode unknown when the
    list comes later, as it may on a loaded machine: the test waits for the list."""

    def node() -> Any:
        found = client.node()
        return found if found.allocation.mode == mode else None

    return wait_for(node, f"the allocation mode {mode}", within)


def killed_apply(state: Path) -> list[dict[str, Any]]:
    """A killed apply's journal: GPU 0 was switched to 1g instances, its snapshot is MIG off.
    Returns the GPUs as they were before it."""
    driver = open_driver("dgx-h100", state)
    store = StateStore(state / "agent.db")
    uuid = driver.gpus()[0].uuid
    before = fetch(driver.layout(uuid)).to_dict()
    held = gpus(state)
    spec = parse_spec(CONFIG)
    MigService(driver, store, PartitionLock(state), simulated_reset(state)).apply(spec, "gpu0-1g")
    desired = {uuid: desired_of(spec.select("gpu0-1g")[1][0])}
    store.journal_append(
        SCOPE, begin_entry("mig apply gpu0-1g", desired, force=False, skip_reset=False)
    )
    store.journal_append(SCOPE, {"event": "gpu", "uuid": uuid, "index": 0, "before": before})
    store.close()
    driver.close()
    return held


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "--config", str(tmp_path / "config.yaml"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def journal(state: Path) -> list[Any]:
    store = StateStore(state / "agent.db")
    try:
        return store.journal_entries(SCOPE)
    finally:
        store.close()


def test_dynamic_mig_refuses_every_mig_change_and_touches_no_gpu(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    state = tmp_path / "state"
    # Anywhere else the start rolls a killed apply back; beside a dynamic-MIG driver it must not.
    killed_apply(state)
    FakeDraPlugin(node_api, NODE, state, dynamic_mig=True).start()
    held = gpus(state)

    with start(tmp_path) as agent, closing(AgentClient(agent.socket)) as client:
        node = settled(client, AllocationMode.DRA_DYNAMIC_MIG)
        assert node.allocation.driver == DRIVER
        assert "DynamicMIG" in node.allocation.evidence
        for call in (
            lambda: client.apply_mig(CONFIG, "gpu0-3g"),
            lambda: client.restore_mig(json.dumps(checkpoint_document([])).encode()),
        ):
            with pytest.raises(ModeRefused, match="allocation mode is dra-dynamic-mig") as refused:
                call()
            assert "nothing was changed" in str(refused.value)
        # Issue 36: a restore of a checkpoint equal to the current layout (nothing to do) is
        # refused as a real one and as an apply are, by the CLI too: never "restored".
        checkpoint = tmp_path / "now.json"
        saved = _cli(tmp_path, "mig", "checkpoint", "-f", str(checkpoint))
        assert saved.returncode == 0, saved.stderr
        (tmp_path / "mig.yaml").write_text(CONFIG)
        for argv in (
            ("mig", "restore", "-f", str(checkpoint)),
            ("mig", "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "gpu0-3g"),
        ):
            refused_by_cli = _cli(tmp_path, *argv)
            assert refused_by_cli.returncode == ModeRefused.exit_code, refused_by_cli.stdout
            assert "allocation mode is dra-dynamic-mig" in refused_by_cli.stderr, argv
            assert "restored successfully" not in refused_by_cli.stdout
        metrics = client.metrics().body.decode()
        assert 'gpu_agent_allocation_mode{mode="dra-dynamic-mig"} 1.0' in metrics
        assert all(op.done for op in client.list_operations())  # none was left running
    assert gpus(state) == held  # the start-up recovery left GPU 0 as the driver found it
    assert journal(state)  # kept for a mode that allows acting on it


def test_a_static_apply_succeeds_once_the_driver_republished_the_new_devices(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    state = tmp_path / "state"
    plugin = FakeDraPlugin(node_api, NODE, state, delay_s=0.3).start()
    with (
        start(tmp_path, republish_timeout_s=20) as agent,
        closing(AgentClient(agent.socket)) as client,
    ):
        settled(client, AllocationMode.DRA)
        phases: list[str] = []
        done = client.follow(
            client.apply_mig(CONFIG, "gpu0-1g"),
            lambda op: phases.append(op.mig_progress.phase),
        )
        assert done.error is None, done.error
        # Success came after the plugin's restart and its new slice, never before it.
        assert plugin.restarts == 1 and plugin.publishes == 2
        assert "republish" in phases
        assert slice_uuids(node_api) == nvml_uuids(state)
        assert sum(u.startswith("MIG-") for u in slice_uuids(node_api)) == 7


def test_an_apply_rolls_back_when_the_driver_never_republishes(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    state = tmp_path / "state"
    plugin = FakeDraPlugin(node_api, NODE, state, republish=False).start()
    held = gpus(state)
    with (
        start(tmp_path, republish_timeout_s=0.5) as agent,
        closing(AgentClient(agent.socket)) as client,
    ):
        settled(client, AllocationMode.DRA)
        with pytest.raises(Conflict) as failed:
            client.follow(client.apply_mig(CONFIG, "gpu0-1g"), lambda _: None)
        message = str(failed.value)
        assert "did not republish the new layout within 0.5s" in message
        assert "7 new device(s) not listed" in message
        assert "rolled back GPU 0 to the layout before the apply" in message
        assert plugin.restarts == 2  # once to publish the apply, once for the rollback
    assert gpus(state) == held
    assert not journal(state)


@pytest.mark.parametrize("seen", [False, True], ids=["unread-at-start", "turned-unread"])
def test_a_static_apply_beside_an_unread_gpu_compares_the_gpus_read_and_succeeds(
    tmp_path: Path, node_api: FakeKubeApi, seen: bool
) -> None:
    """GPU 7 listed but failing its MIG mode read (a GPU waiting for a reset), the plugin
    still listing its device. The wait compared the slices with the devices of the GPUs read
    only, so it never matched: a good apply of GPU 0 timed out and was rolled back. Now a
    listed device of a GPU not read is not compared, whether its uuid was ever read or not."""
    state = tmp_path / "state"
    control = SimControl(state)
    plugin = FakeDraPlugin(node_api, NODE, state, delay_s=0.3).start()
    if not seen:
        control.inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=7, count=10**6)
    with (
        start(tmp_path, republish_timeout_s=8) as agent,
        closing(AgentClient(agent.socket)) as client,
    ):
        settled(client, AllocationMode.DRA)
        if seen:
            control.inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=7, count=10**6)
        said: list[str] = []
        done = client.follow(
            client.apply_mig(ONLY_GPU_0, "gpu0-1g"),
            lambda op: said.append(op.mig_progress.current_step),
        )
        assert done.error is None, done.error
        assert plugin.restarts == 1  # no rollback, no second restart
        gpu_7 = next(g["uuid"] for g in SimControl(state).describe()["gpus"] if g["index"] == 7)
        assert gpu_7 in slice_uuids(node_api)  # listed, and not compared
        assert sum(u.startswith("MIG-") for u in slice_uuids(node_api)) == 7
        assert any("GPU 7 not read: its devices are not compared" in m for m in said), said


def test_an_api_that_does_not_answer_makes_the_mode_unknown_and_refuses_mig(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    node_api.unavailable.add("/apis/resource.k8s.io/v1/resourceslices")
    state = tmp_path / "state"
    before = killed_apply(state)
    held = gpus(state)
    with start(tmp_path) as agent:
        with closing(AgentClient(agent.socket)) as client:
            allocation = client.node().allocation
            assert allocation.mode == AllocationMode.UNKNOWN
            assert "has not answered yet" in allocation.evidence
        (tmp_path / "mig.yaml").write_text(CONFIG)
        refused = subprocess.run(
            [sys.executable, "-m", "agent.cli.main", "--config", str(tmp_path / "config.yaml"),
             "mig", "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "gpu0-1g"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert refused.returncode == 12, refused.stderr
        assert "allocation mode is unknown" in refused.stderr
        assert "set dra.mode" in refused.stderr
        assert gpus(state) == held and journal(state)  # nor was the killed apply undone
        # Once the API answers, the mode is detected and shown, and the recovery runs.
        node_api.unavailable.clear()
        with closing(AgentClient(agent.socket)) as client:
            # The informer retries a failing API on a back-off that reaches 30 s (+-50 %):
            # the mode is known at its next list, whenever that falls.
            settled(client, AllocationMode.NONE, 60)
        wait_for(lambda: not journal(state), "the deferred MIG recovery", 30)
    assert gpus(state) == before


def test_a_device_plugin_node_applies_as_before_and_follows_a_driver_that_appears(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    node_api.set_node_status(
        NODE, {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}
    )
    with start(tmp_path) as agent, closing(AgentClient(agent.socket)) as client:
        allocation = settled(client, AllocationMode.DEVICE_PLUGIN).allocation
        assert allocation.evidence == "Node allocatable nvidia.com/gpu=8"
        done = client.follow(client.apply_mig(CONFIG, "gpu0-1g"), lambda _: None)
        assert done.error is None
        assert not [r for r in node_api.requests if r.method == "DELETE"]  # no plugin restart
        # A DynamicMIG driver starts on the node: seen through the watch, and MIG is refused.
        FakeDraPlugin(node_api, NODE, tmp_path / "state", dynamic_mig=True).start()
        wait_for(
            lambda: client.node().allocation.mode == AllocationMode.DRA_DYNAMIC_MIG,
            "the new mode in GetNode",
            30,
        )
        assert "conflicting" in client.node().allocation.evidence
        with pytest.raises(ModeRefused, match="dra-dynamic-mig"):
            client.apply_mig(CONFIG, "gpu0-3g")


def test_a_cancel_while_waiting_for_the_driver_rolls_the_apply_back(
    tmp_path: Path, node_api: FakeKubeApi
) -> None:
    state = tmp_path / "state"
    FakeDraPlugin(node_api, NODE, state, republish=False).start()
    held = gpus(state)
    with start(tmp_path, republish_timeout_s=60) as agent, closing(AgentClient(agent.socket)) as c:
        op = c.apply_mig(CONFIG, "gpu0-1g")
        wait_for(
            lambda: c.get_operation(op.name).mig_progress.phase == "republish",
            "the wait for the driver",
            30,
        )
        c.cancel_operation(op.name)
        with pytest.raises(AgentError, match="cancelled before waiting for the ResourceSlices"):
            c.follow(op, lambda _: None)
    assert gpus(state) == held
    assert not journal(state)


def test_a_dra_node_without_an_api_refuses_a_no_op_restore_as_the_agent_refuses_an_apply(
    tmp_path: Path,
) -> None:
    """Issue 36: dra.mode set to dra and no Kubernetes API, so the DRA driver cannot be made to
    republish: the agent refuses every MIG change, and the CLI's restore of the layout already
    in place (which skips the agent's apply) is refused by the agent's words too (exit 12).
    `mig plan`, the apply's dry run, says the same: it showed a plan and exited 0."""
    (tmp_path / "mig.yaml").write_text(CONFIG)
    with start(tmp_path, mode="dra") as agent, closing(AgentClient(agent.socket)) as client:
        node = client.node()
        assert node.allocation.mode == AllocationMode.DRA
        assert "cannot make the DRA driver republish" in node.mig_refusal
        for call in (
            lambda: client.apply_mig(CONFIG, "gpu0-1g"),
            lambda: client.plan_mig(CONFIG, "gpu0-1g"),  # the apply's forecast says so too
        ):
            with pytest.raises(ModeRefused, match="cannot make the DRA driver republish"):
                call()
        checkpoint = tmp_path / "now.json"
        assert _cli(tmp_path, "mig", "checkpoint", "-f", str(checkpoint)).returncode == 0
        for argv in (
            ("mig", "restore", "-f", str(checkpoint)),
            ("mig", "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "gpu0-1g"),
            ("mig", "plan", "-f", str(tmp_path / "mig.yaml"), "-c", "gpu0-1g"),
        ):
            refused = _cli(tmp_path, *argv)
            assert refused.returncode == ModeRefused.exit_code, (argv, refused.stdout)
            assert "cannot make the DRA driver republish" in refused.stderr, argv
            assert "successfully" not in refused.stdout


@pytest.mark.parametrize("case", ["no plugin pod", "delete forbidden"])
def test_an_apply_the_driver_could_not_be_made_to_republish_is_refused_before_any_change(
    tmp_path: Path, node_api: FakeKubeApi, case: str
) -> None:
    """With no kubelet plugin pod matching dra.plugin_namespace/plugin_label_selector on the
    node, or its delete forbidden, an apply on a dra node changed the GPUs, then failed to
    restart the plugin and rolled them back. The agent now asks first (a list, and a dry-run
    delete the API server authorizes as a real one) and refuses before any change, naming
    the settings (docs/dra.md, "Static MIG under DRA")."""
    state = tmp_path / "state"
    plugin = FakeDraPlugin(node_api, NODE, state).start()
    held = gpus(state)
    dra: dict[str, Any] = {"republish_timeout_s": 5}
    if case == "no plugin pod":
        dra["plugin_namespace"] = "elsewhere"
    else:
        pod = f"/api/v1/namespaces/gpu-operator/pods/{plugin._pod}"
        node_api.forbidden.add(("DELETE", pod))
    with start(tmp_path, **dra) as agent, closing(AgentClient(agent.socket)) as client:
        settled(client, AllocationMode.DRA)
        with pytest.raises(Conflict) as refused:
            client.follow(client.apply_mig(CONFIG, "gpu0-1g"), lambda _: None)
        message = str(refused.value)
        assert "nothing was changed" in message and "rolled back" not in message, message
        assert "dra.plugin_namespace" in message
        assert plugin.restarts == 0
    assert gpus(state) == held
    assert not journal(state)
