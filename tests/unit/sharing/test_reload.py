"""Reload methods and the "has the plugin picked it up" judgement (reference/mig.md §5.2)."""

from __future__ import annotations

import pytest

from agent.errors import InvalidSpec
from agent.kube import InClusterKubeClient
from agent.sharing.reload import (
    CONFIG_LABEL,
    LabelReloader,
    NoReload,
    PluginProcess,
    RestartPodReloader,
    SighupReloader,
    make_reloader,
    pickup,
)
from agent.sharing.view import ReloadReport, StatusRecord
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE


def clock() -> float:
    return 1000.0


def test_sighup_without_a_plugin_process_says_so_and_does_not_claim_a_reload() -> None:
    report = SighupReloader("gpu-agent-test-no-such-process", clock).reload()
    assert report == ReloadReport("sighup", False, report.detail, 1000.0)
    assert "no process named gpu-agent-test-no-such-process" in report.detail
    assert "hostPID" in report.detail


def test_label_reload_switches_the_config_label(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    report = LabelReloader(kube, NODE, "gpu-agent", clock).reload()
    assert report.done
    assert api.nodes[NODE][CONFIG_LABEL] == "gpu-agent"
    assert "was unset" in report.detail


def test_label_already_set_is_reported_as_not_reloaded(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """config-manager acts on a label change only; an unchanged label reloads nothing."""
    api, _ = kube_api
    api.nodes[NODE][CONFIG_LABEL] = "gpu-agent"
    report = LabelReloader(kube, NODE, "gpu-agent", clock).reload()
    assert not report.done
    assert "only when the label changes" in report.detail
    assert not any(r.method == "PATCH" for r in api.requests)


def test_restart_pod_deletes_this_nodes_plugin_pod(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    reloader = RestartPodReloader(
        kube, NODE, "gpu-operator", "app=nvidia-device-plugin-daemonset", clock
    )
    report = reloader.reload()
    assert report.done
    assert "nvidia-device-plugin-daemonset-abcde" in report.detail
    assert [p.name for p in api.pods if p.node == NODE] == ["gpu-feature-discovery-klmno"]
    assert not reloader.reload().done  # nothing left to delete on this node


def test_none_writes_only() -> None:
    assert not NoReload(clock).reload().done


def make(method: str, **kw: object) -> object:
    args: dict[str, object] = {
        "process_name": "nvidia-device-plugin",
        "label_config_name": "gpu-agent",
        "namespace": "gpu-operator",
        "label_selector": "app=x",
        "kube": None,
        "node_name": None,
        **kw,
    }
    return make_reloader(method, **args)  # type: ignore[arg-type]


def test_make_reloader_refuses_what_cannot_work_before_anything_is_written(
    kube: InClusterKubeClient,
) -> None:
    with pytest.raises(InvalidSpec) as exc:
        make("label")
    assert [v.field for v in exc.value.violations] == ["sharing.reload", "node_name"]
    with pytest.raises(InvalidSpec) as exc:
        make("label", kube=kube, node_name=NODE, label_config_name="not a label!")
    assert [v.field for v in exc.value.violations] == ["sharing.label_config_name"]
    with pytest.raises(InvalidSpec) as exc:
        make("reboot")
    assert [v.field for v in exc.value.violations] == ["sharing.reload"]
    assert isinstance(make("sighup"), SighupReloader)
    assert isinstance(make("none"), NoReload)
    assert isinstance(make("restart-pod", kube=kube, node_name=NODE), RestartPodReloader)


def test_status_record_round_trips_and_rejects_bad_shapes() -> None:
    record = StatusRecord("set", "ab", 5.0, ReloadReport("sighup", True, "d", 6.0, (7,)))
    assert StatusRecord.from_json(record.to_json()) == record
    assert StatusRecord.from_json({"action": "set"}) is None
    assert StatusRecord.from_json({**record.to_json(), "written_at": "soon"}) is None


def judge(
    status: StatusRecord | None,
    processes: list[PluginProcess],
    *,
    sha: str = "s",
    mtime: float = 99.0,
) -> tuple[str, str]:
    result = pickup(
        file_sha256=sha,
        file_mtime=mtime,
        status=status,
        processes=processes,
        process_name="nvidia-device-plugin",
    )
    return result.state, result.detail


WRITTEN = 100.0


def ours(reload: ReloadReport | None) -> StatusRecord:
    return StatusRecord("set", "s", WRITTEN, reload)


def test_a_plugin_started_after_the_write_has_loaded_it() -> None:
    state, detail = judge(ours(None), [PluginProcess(42, WRITTEN + 5)])
    assert state == "loaded"
    assert "pid 42 started after" in detail


def test_a_plugin_started_within_a_second_of_the_write_is_not_judged() -> None:
    """psutil's start times carry up to a second of error (boot time in whole seconds)."""
    for started in (WRITTEN - 0.9, WRITTEN, WRITTEN + 0.9):
        state, detail = judge(ours(None), [PluginProcess(42, started)])
        assert state == "unknown", started
        assert "within a second" in detail


def test_a_signalled_plugin_that_still_runs_is_reported_as_signalled() -> None:
    reload = ReloadReport("sighup", True, "", WRITTEN, (42,))
    state, detail = judge(ours(reload), [PluginProcess(42, WRITTEN - 50)])
    assert state == "signalled"
    assert "pid 42 was sent SIGHUP" in detail


def test_a_plugin_older_than_the_write_and_not_signalled_has_not_loaded_it() -> None:
    reload = ReloadReport("none", False, "", WRITTEN)
    state, _ = judge(ours(reload), [PluginProcess(42, WRITTEN - 50)])
    assert state == "not-loaded"
    # Signalled a process that has since been replaced by an older-started one: not ours.
    reload = ReloadReport("sighup", True, "", WRITTEN, (41,))
    assert judge(ours(reload), [PluginProcess(42, WRITTEN - 50)])[0] == "not-loaded"


def test_no_plugin_process_means_not_loaded_yet() -> None:
    state, detail = judge(ours(None), [])
    assert state == "not-loaded"
    assert "hostPID" in detail


def test_a_label_switch_is_not_observable() -> None:
    reload = ReloadReport("label", True, "", WRITTEN)
    assert judge(ours(reload), [PluginProcess(42, WRITTEN - 50)])[0] == "unknown"


def test_a_file_the_agent_did_not_write_is_judged_by_its_mtime_only() -> None:
    foreign = StatusRecord("set", "other-sha", WRITTEN, ReloadReport("sighup", True, "", 1, (42,)))
    assert judge(foreign, [PluginProcess(42, 50.0)], mtime=60.0)[0] == "unknown"
    assert judge(foreign, [PluginProcess(42, 70.0)], mtime=60.0)[0] == "loaded"
    assert judge(None, [], sha="s")[0] == "not-loaded"


def test_no_file_means_plugin_defaults() -> None:
    result = pickup(file_sha256=None, file_mtime=None, status=None, processes=[], process_name="p")
    assert result.state == "unknown"
    assert "defaults" in result.detail
