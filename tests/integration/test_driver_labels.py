"""While the driver is detached, the Node carries nothing about the GPUs nobody verified
(docs/operations.md, "Labels never claim what nobody verified"): the whole agent on a thread,
its simulated driver unloaded, against a fake Kubernetes API server.

- no GPU Operator MIG label protocol: a ``nvidia.com/mig.config`` set meanwhile publishes no
  ``nvidia.com/mig.config.state`` (a pass then would publish ``failed`` and wait its back-off,
  which is not what the user asked), and is applied once the driver attaches;
- no GPU marked reclaimable (``gpu-agent.io/reclaimable``): no idle time is known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.gpu.sim import SimControl, open_simulator
from agent.mig.labels import CONFIG_LABEL, STATE_LABEL
from agent.reclaim import ANNOTATION
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import REPO, InProcessAgent, agent_config, wait_for

pytestmark = pytest.mark.integration

#: all-balanced for the dgx-h100's boards, as shipped.
CONFIG = REPO / "examples" / "mig-config.yaml"


def _states_written(api: FakeKubeApi) -> list[str]:
    """Every value of the MIG state label the Node took, in order."""
    seen: list[str] = []
    for _, resource, _, obj in api.history:
        if resource != "nodes" or obj["metadata"]["name"] != NODE:
            continue
        state = (obj["metadata"].get("labels") or {}).get(STATE_LABEL)
        if state is not None and (not seen or seen[-1] != state):
            seen.append(state)
    return seen


def _idle_past(snapshot: Any, seconds: float) -> bool:
    idle = snapshot.gpu_idle_seconds() if snapshot is not None else {}
    return len(idle) == 8 and min(idle.values()) >= seconds


def _reclaim_pass(agent: InProcessAgent) -> Any:
    """The agent's reclaim pass, as its runner calls it."""
    (task,) = [t for t in agent.node.services.tasks() if t.name == "reclaim"]
    return task.work()


def test_while_detached_no_mig_state_or_reclaim_mark_and_the_label_set_meanwhile_applies_on_attach(
    tmp_path: Path, in_cluster: FakeKubeApi
) -> None:
    api = in_cluster
    root = tmp_path / "agent"
    open_simulator(root / "state", "dgx-h100")
    control = SimControl(root / "state")
    control.driver_absent()
    config = agent_config(
        root,
        node_name=NODE,
        mig={"watch_node_label": True, "config_file": str(CONFIG)},
        telemetry={
            "kubelet_socket": str(root / "kubelet.sock"),
            "interval_s": 0.2,
            "idle_reclaim_after_s": 0.5,
        },
        driver={"retry_max_s": 0.2, "check_s": 0.2},
    )
    with InProcessAgent(root, config) as agent:
        services = agent.node.services
        assert not services.driver.is_attached
        api.set_labels(NODE, {CONFIG_LABEL: "all-balanced"})
        # The agent's Node watch saw the label: its label pass was woken while detached.
        wait_for(
            lambda: (
                (services.edge.owner.node_object() or {})
                .get("metadata", {})
                .get("labels", {})
                .get(CONFIG_LABEL)
            ),
            "the label in the agent's Node watch",
            10,
        )
        assert not _reclaim_pass(agent)  # idle GPUs, but nobody reads them: nothing marked
        assert ANNOTATION not in api.node_annotations.get(NODE, {})

        control.driver_present()
        wait_for(lambda: api.nodes[NODE].get(STATE_LABEL) == "success", "the label applied", 30)
        # Nothing was said about the label while detached: pending, then success.
        assert _states_written(api) == ["pending", "success"]
        layout = services.inventory.layouts()[0]
        assert sorted(i.profile_name for i in layout.instances) == [
            "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"
        ]  # fmt: skip

        # GPUs idle past the threshold, then the driver goes: no pass may mark them now.
        wait_for(lambda: _idle_past(services.telemetry.latest(), 0.5), "GPUs idle 0.5 s", 10)
        control.driver_absent()
        wait_for(lambda: not services.driver.is_attached, "the agent detached", 10)
        assert not _reclaim_pass(agent)
        assert ANNOTATION not in api.node_annotations.get(NODE, {})

        # The same pass marks them once the GPUs answer again.
        control.driver_present()
        marked = wait_for(lambda: _reclaim_pass(agent), "GPUs marked reclaimable", 10)
        assert marked == tuple(range(8))
        assert api.node_annotations[NODE][ANNOTATION] == "0,1,2,3,4,5,6,7"
