"""A sharing config the plugin was not made to load is not in effect: `fleet apply share` ends
such a node failed ("written, not reloaded"; exit 10), and a node whose plugin has not loaded
the config its file says counts as drifted, so a later pass (whose set reloads it) retries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import sharing_pb2
from agent.coordinator.rollout.actions import share_result
from agent.coordinator.rollout.schedule import NodeState
from agent.sharing import parse
from agent.sharing.reload import NO_HOSTPID
from agent.sharing.view import Pickup, ReloadReport, SharingView, StatusRecord
from agent.wire.sharing import reload_pb, sharing_view_pb
from tests.unit.coordinator.agents import Outcome, invoke_process
from tests.unit.coordinator.fakeagents import FakeAgents, fake_agents, mark, node

NO_PROCESS = "no process named nvidia-device-plugin found"


@pytest.fixture
def agents() -> Iterator[FakeAgents]:
    with fake_agents() as found:
        yield found


def _share(agents: FakeAgents, *extra: str) -> Outcome:
    args = ["fleet", "apply", "share", "--strategy", "time-slicing", "--replicas", "2"]
    return invoke_process([*args, "-o", "json", *extra, *agents.args()], timeout=60)


def _report(method: str, done: bool, detail: str) -> ReloadReport:
    return ReloadReport(method, done, detail, 1000.0)


def test_a_node_whose_plugin_was_not_reloaded_ends_failed_not_succeeded(
    agents: FakeAgents,
) -> None:
    """It ended `succeeded` (exit 0) with the config written and the plugin on its old one."""
    written = sharing_pb2.SharingChange(changed=True)
    written.reload.CopyFrom(reload_pb(_report("sighup", False, NO_PROCESS)))
    agents.add(node("a", mark("healthy")), sharing_change=written)
    agents.add(node("b", mark("healthy")))  # the default answer: changed, no reload said
    result = _share(agents, "--max-failures", "2")
    assert result.exit_code == 10, result.output
    nodes = json.loads(result.output.split("\nerror:")[0])["record"]["nodes"]
    assert nodes["a"]["state"] == "failed"
    assert nodes["a"]["detail"] == f"written, not reloaded: {NO_PROCESS}"
    assert nodes["b"]["state"] == "succeeded"


def test_each_set_outcome_is_said_as_what_it_is() -> None:
    assert share_result(True, _report("sighup", True, "sent SIGHUP")).state is NodeState.SUCCEEDED
    # reload none: something else reloads the plugin, as the agent's config says
    assert share_result(True, _report("none", False, "reload: none")).state is NodeState.SUCCEEDED
    assert share_result(False, None).state is NodeState.UNCHANGED
    again = share_result(False, _report("sighup", True, "sent SIGHUP to pid 7"))
    assert again.state is NodeState.SUCCEEDED and "had not loaded it" in again.detail
    failed = share_result(False, _report("label", False, "label already set"))
    assert (failed.state, failed.detail) == (
        NodeState.FAILED,
        "already written, not reloaded: label already set",
    )


def _view(
    state: str, method: str, why: str = "no nvidia-device-plugin process is running"
) -> sharing_pb2.GetSharingResponse:
    config = parse(
        {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    )
    report = _report(method, method == "none", NO_PROCESS)
    return sharing_view_pb(
        SharingView(
            config_path=Path("/etc/nvidia-device-plugin/config.yaml"),
            exists=True,
            config=config,
            advertised=(),
            problems=(),
            pickup=Pickup(state, why),  # type: ignore[arg-type]
            last_write=StatusRecord("set", "0" * 64, 1000.0, report),
        )
    )


@pytest.mark.parametrize(("method", "would"), [("label", "change"), ("sighup", "unchanged")])
def test_an_unseen_plugin_is_previewed_as_the_agents_set_would_reload_it(
    agents: FakeAgents, method: str, would: str
) -> None:
    """Without hostPID the pickup is unknown: the agent's set reloads again by a label (its
    last one did not reach the plugin), never by a signal it cannot deliver; the dry run
    judged only "not-loaded" and said "unchanged" where the set would reload."""
    unseen = _view("unknown", method, f"{NO_HOSTPID}: whether it loaded is not observable")
    agents.add(node("a", mark("healthy")), sharing_view=unseen)
    (preview,) = json.loads(_share(agents, "--dry-run").output)["previews"]
    assert preview["would"] == would, preview


@pytest.mark.parametrize(
    ("state", "method", "would"),
    [
        ("not-loaded", "sighup", "change"),  # the set reloads it
        ("not-loaded", "none", "unchanged"),  # something else reloads it: nothing to retry
        ("signalled", "sighup", "unchanged"),
    ],
)
def test_a_config_written_but_not_loaded_is_drift(
    agents: FakeAgents, state: str, method: str, would: str
) -> None:
    """Drift was judged from the file alone: the reload was never retried."""
    agents.add(node("a", mark("healthy")), sharing_view=_view(state, method))
    dry = _share(agents, "--dry-run")
    assert dry.exit_code == 0, dry.output
    (preview,) = json.loads(dry.output)["previews"]
    assert preview["would"] == would, preview
    if would == "change":
        assert "written, not loaded: no nvidia-device-plugin process" in preview["detail"]
