"""SharingService: decide purely, then write atomically and reload; refuse without writing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.config import SharingSettings
from agent.errors import Conflict, InvalidSpec, NotFound, PermissionDenied
from agent.gpu.types import GpuLayout
from agent.kube import InClusterKubeClient
from agent.sharing import parse
from agent.sharing.reload import CONFIG_LABEL
from agent.sharing.service import SharingService
from agent.sharing.view import Pickup
from agent.wire.sharing import sharing_change_from, sharing_change_pb
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.sharing.layouts import full_gpu, mig_gpu, node

README_FLAGS = (Path(__file__).parent / "golden" / "readme-flags.yaml").read_text()


def ts(name: str = "nvidia.com/gpu", replicas: int = 4, **flags: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "sharing": {"timeSlicing": {"resources": [{"name": name, "replicas": replicas}]}}
    }
    if flags:
        doc["flags"] = flags
    return doc


class Node:
    """A node whose MIG layout tests can change between calls."""

    def __init__(self, layouts: Sequence[GpuLayout]) -> None:
        self.layouts = list(layouts)

    def __call__(self) -> Sequence[GpuLayout]:
        return self.layouts


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    d = tmp_path / "nvidia-device-plugin"
    d.mkdir()
    return d / "config.yaml"


def service(
    path: Path,
    layouts: Sequence[GpuLayout] | Node = (),
    *,
    reload: str = "none",
    kube: InClusterKubeClient | None = None,
) -> SharingService:
    provider = layouts if isinstance(layouts, Node) else Node(layouts or node(8))
    settings = SharingSettings(config_path=path, reload=reload)
    return SharingService(settings, provider, kube, node_name=NODE, clock=lambda: 1000.0)


@pytest.mark.usefixtures("plugin_loaded")
def test_set_writes_the_config_and_reports_what_is_advertised(config_path: Path) -> None:
    result = service(config_path).set(parse(ts()))
    assert result.changed
    assert parse(config_path.read_bytes()) == result.config
    assert [(a.resource, a.count) for a in result.advertised] == [("nvidia.com/gpu", 32)]
    assert result.reload is not None and result.reload.method == "none"
    assert not result.reload.done


def test_a_set_the_file_already_says_retries_a_reload_that_did_not_reach_the_plugin(
    config_path: Path,
) -> None:
    """It answered "Unchanged" without reloading, so the plugin kept its old config for good
    (here no plugin process is visible: `share show` says not-loaded)."""
    sharing = service(config_path, reload="sighup")
    first = sharing.set(parse(ts()))
    assert first.changed and first.reload is not None and not first.reload.done
    assert sharing.show().pickup.state == "not-loaded"
    written = config_path.read_bytes()
    again = sharing.set(parse(ts()))
    assert not again.changed and config_path.read_bytes() == written  # nothing written
    assert again.reload is not None and again.reload.method == "sighup"  # tried again
    assert sharing.show().last_write is not None  # the record still says the first write
    # With reload none something else reloads the plugin: unchanged, nothing tried.
    plain = service(config_path).set(parse(ts()))
    assert not plain.changed and plain.reload is None


def test_set_keeps_the_files_flags_and_the_previous_version(config_path: Path) -> None:
    """The file is shared with the plugin: its other settings survive a sharing change."""
    config_path.write_text(README_FLAGS)
    service(config_path).set(parse(ts()))
    written = parse(config_path.read_text())
    assert written.flags == parse(README_FLAGS).flags
    assert written.sharing == parse(ts()).sharing
    assert config_path.with_name("config.yaml.previous").read_text() == README_FLAGS


def test_setting_the_same_sharing_again_writes_and_reloads_nothing(config_path: Path) -> None:
    svc = service(config_path)
    svc.set(parse(ts()))
    before = (
        config_path.stat().st_mtime_ns,
        config_path.with_name("config.yaml.status.json").read_bytes(),
    )
    result = svc.set(parse(ts()))
    assert not result.changed and result.reload is None
    after = (
        config_path.stat().st_mtime_ns,
        config_path.with_name("config.yaml.status.json").read_bytes(),
    )
    assert after == before


def test_a_refused_set_writes_nothing(config_path: Path) -> None:
    with pytest.raises(InvalidSpec) as exc:
        service(config_path).set(parse(ts(replicas=1)))
    assert [v.field for v in exc.value.violations] == ["sharing.timeSlicing.resources[0].replicas"]
    assert sorted(p.name for p in config_path.parent.iterdir()) == []


def test_reload_settings_that_cannot_work_are_refused_before_writing(config_path: Path) -> None:
    with pytest.raises(InvalidSpec) as exc:
        service(config_path, reload="label").set(parse(ts()))
    assert [v.field for v in exc.value.violations] == ["sharing.reload"]
    assert not config_path.exists()


@pytest.mark.usefixtures("plugin_loaded")
def test_mig_resources_under_mixed_with_the_strategy_set_in_the_same_request(
    config_path: Path,
) -> None:
    layouts = [mig_gpu(0, *["1g.10gb"] * 7), full_gpu(1)]
    result = service(config_path, layouts).set(
        parse(ts("nvidia.com/mig-1g.10gb", 3, migStrategy="mixed"))
    )
    assert {a.resource: a.count for a in result.advertised} == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": 21,
    }


def test_a_change_that_leaves_gpus_out_says_so_in_its_answer_not_only_in_show(
    config_path: Path,
) -> None:
    """migStrategy single on a node with MIG on one GPU of two is written (the layout may be
    made uniform next), and the plugin then advertises nvidia.com/gpu 0. The answer said
    only that count; the why was in `share show` alone. The change now says it too."""
    layouts = [mig_gpu(0, *["1g.10gb"] * 7), full_gpu(1)]
    svc = service(config_path, layouts)
    result = svc.set(
        parse({"version": "v1", "flags": {"migStrategy": "single"}}), keep_sharing=True
    )
    assert result.changed
    assert [p.field for p in result.problems] == ["flags.migStrategy"]
    assert "migStrategy single, but" in result.problems[0].description
    assert result.problems == svc.show().problems
    # Through the API and back, as the CLI reads it.
    assert sharing_change_from(sharing_change_pb(result)).problems == result.problems


@pytest.mark.usefixtures("plugin_loaded")
def test_with_mig_enabled_and_the_plugin_s_strategy_unread_the_count_is_not_known(
    config_path: Path,
) -> None:
    """No plugin process is visible (no hostPID, as on a GPU Operator node, whose plugin takes
    MIG_STRATEGY from its environment) and the file sets no migStrategy: `share set` and `share
    show` counted GPU 0 whole under "none" (4 x nvidia.com/gpu) and hid the strategy problem as
    unknown. The count is now not known, saying why; a strategy in the file makes it known, and
    a node without MIG enabled is advertised alike under every strategy."""
    layouts = [mig_gpu(0, *["1g.10gb"] * 7), full_gpu(1)]
    svc = service(config_path, layouts)
    result = svc.set(parse(ts(replicas=2)))
    assert result.changed and result.advertised == ()
    assert result.advertised_unknown.startswith(
        "the plugin's migStrategy is not known and MIG is enabled on GPU(s) 0,"
    )
    assert "run the agent with hostPID: true, or set flags.migStrategy" in result.advertised_unknown
    view = svc.show()
    assert view.advertised == () and view.advertised_unknown == result.advertised_unknown
    known = svc.set(parse(ts(replicas=2, migStrategy="mixed"))).advertised
    assert {a.resource: a.count for a in known} == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.10gb": 7,
    }
    elsewhere = config_path.with_name("no-mig.yaml")  # a file that sets no migStrategy
    whole = service(elsewhere, [full_gpu(0), full_gpu(1)]).set(parse(ts(replicas=2)))
    assert whole.advertised_unknown == ""
    assert [(a.resource, a.count) for a in whole.advertised] == [("nvidia.com/gpu", 4)]


def test_clear_drops_sharing_and_keeps_flags(config_path: Path) -> None:
    config_path.write_text(README_FLAGS)
    svc = service(config_path)
    svc.set(parse(ts()))
    result = svc.clear()
    assert result.changed
    assert parse(config_path.read_text()) == parse(README_FLAGS)
    assert svc.clear().changed is False


def test_clear_without_a_file_changes_nothing(config_path: Path) -> None:
    assert service(config_path).clear().changed is False
    assert not config_path.exists()


def test_rollback_restores_the_previous_config_and_can_be_undone(config_path: Path) -> None:
    svc = service(config_path)
    svc.set(parse(ts(replicas=4)))
    svc.set(parse(ts(replicas=8)))
    assert svc.rollback().config == parse(ts(replicas=4))
    assert parse(config_path.read_text()) == parse(ts(replicas=4))
    svc.rollback()
    assert parse(config_path.read_text()) == parse(ts(replicas=8))


def test_rollback_after_the_first_set_returns_to_plugin_defaults(config_path: Path) -> None:
    svc = service(config_path)
    svc.set(parse(ts()))
    result = svc.rollback()
    assert result.config.sharing.strategy == "none"
    assert config_path.read_bytes() == b""


def test_rollback_without_a_previous_config_is_not_found(config_path: Path) -> None:
    with pytest.raises(NotFound, match="nothing to roll back to"):
        service(config_path).rollback()


def test_rollback_to_a_config_the_node_no_longer_supports_is_refused(config_path: Path) -> None:
    """After a MIG change the old config would be silently ignored: refuse, change nothing."""
    gpus = Node([mig_gpu(0, "1g.10gb", "1g.10gb"), full_gpu(1)])
    svc = service(config_path, gpus)
    svc.set(parse(ts("mig-1g.10gb", 2, migStrategy="mixed")))
    svc.set(parse(ts("nvidia.com/gpu", 2)))
    gpus.layouts = [mig_gpu(0, "7g.80gb"), full_gpu(1)]
    current = config_path.read_bytes()
    with pytest.raises(InvalidSpec, match="cannot roll back") as exc:
        svc.rollback()
    assert [v.field for v in exc.value.violations] == ["sharing.timeSlicing.resources[0].name"]
    assert config_path.read_bytes() == current


def test_an_unparseable_current_file_is_a_conflict(config_path: Path) -> None:
    config_path.write_text("sharing: {timeSlicing: {resources: [{name: gpu}]}}")
    with pytest.raises(Conflict, match=r"resources\[0\]\.replicas: required"):
        service(config_path).set(parse(ts()))
    with pytest.raises(Conflict):
        service(config_path).show()


def test_a_directory_where_the_config_should_be_is_a_conflict_naming_it(
    config_path: Path,
) -> None:
    """A hostPath mounted at ``config.yaml`` that does not exist on the host is made a
    directory by the kubelet. Reading it was an IsADirectoryError traceback, out of ``share``
    and out of the agent's start (its inventory reads the sharing view). Every command now
    refuses it as a Conflict naming the path and what to fix, and nothing is written
    (docs/sharing.md, "Files")."""
    config_path.mkdir()
    svc = service(config_path)
    for call in (svc.show, lambda: svc.set(parse(ts())), svc.clear, svc.rollback):
        with pytest.raises(Conflict, match=f"{config_path} is a directory"):
            call()
    assert [p.name for p in config_path.parent.iterdir()] == ["config.yaml"]
    assert list(config_path.iterdir()) == []


def test_show_reports_strategy_capacity_problems_and_pickup(config_path: Path) -> None:
    gpus = Node(node(8))
    svc = service(config_path, gpus)
    svc.set(parse(ts(replicas=4)))
    view = svc.show()
    assert view.exists and view.config.sharing.strategy == "time-slicing"
    assert view.problems == ()
    assert view.last_write is not None and view.last_write.action == "set"
    assert view.pickup.state == "not-loaded"  # no plugin process here
    gpus.layouts = []
    assert [p.field for p in svc.show().problems] == ["sharing.timeSlicing.resources[0].name"]


def test_what_the_plugin_advertises_is_not_known_until_it_loads_the_file(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`share show` and `set` listed ADVERTISED 32 beside `Plugin: not-loaded`: the plugin
    advertised its old config's count. Until it has loaded the file (loaded or signalled) the
    count is not known, and the why says what it advertises once it does."""
    svc = service(config_path)
    result = svc.set(parse(ts(replicas=4)))
    view = svc.show()
    assert view.pickup.state == "not-loaded"
    for said in (result, view):
        assert said.advertised == ()
        assert said.advertised_unknown.startswith("the plugin has not loaded this config")
        assert said.advertised_unknown.endswith("once it does it advertises nvidia.com/gpu 32")
    for state in ("loaded", "signalled"):
        monkeypatch.setattr(SharingService, "_pickup", lambda *_a, s=state: Pickup(s, "test"))
        counted = svc.show()
        assert [(a.resource, a.count) for a in counted.advertised] == [("nvidia.com/gpu", 32)]
        assert counted.advertised_unknown == ""


def test_show_without_a_file(config_path: Path) -> None:
    view = service(config_path).show()
    assert not view.exists and view.last_write is None
    assert view.config.sharing.strategy == "none"
    assert view.pickup.state == "unknown"


def test_show_without_the_config_directory_does_not_claim_the_plugin_s_defaults(
    tmp_path: Path,
) -> None:
    """The directory is not mounted into the agent: the plugin may well run with a file the
    agent cannot see. `share show` said "absent: the plugin runs with its defaults"."""
    unmounted = tmp_path / "nvidia-device-plugin"
    view = service(unmounted / "config.yaml").show()
    assert not view.exists and view.pickup.state == "unknown"
    assert view.pickup.detail == (
        f"{unmounted} is not mounted into the agent: which config the plugin runs with is not known"
    )


def test_with_a_gpu_lost_what_the_plugin_advertises_is_not_known(config_path: Path) -> None:
    """GPU 3 does not answer: `share show` and `share set` counted the seven that do (28 of
    nvidia.com/gpu), but the plugin's own read of GPU 3 fails too, so it may not start, or may
    leave it out. The config is still checked against, and written for, the GPUs that answer."""
    settings = SharingSettings(config_path=config_path, reload="none")
    svc = SharingService(settings, Node(node(7)), gpus_lost=lambda: (3,))
    result = svc.set(parse(ts()))
    assert result.changed and result.advertised == ()
    assert result.advertised_unknown.startswith("GPU 3 lost: the plugin's own read of it fails")
    view = svc.show()
    assert view.advertised == () and view.advertised_unknown == result.advertised_unknown
    assert view.problems == ()  # the config fits the GPUs that answer
    with pytest.raises(InvalidSpec):  # and is still checked against them
        svc.set(parse(ts("nvidia.com/mig-1g.10gb")))


def test_show_does_not_claim_a_file_written_by_someone_else(config_path: Path) -> None:
    svc = service(config_path)
    svc.set(parse(ts()))
    config_path.write_text(config_path.read_text() + "\n# edited by hand\n")
    assert svc.show().last_write is None


def test_label_reload_through_the_api(
    config_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    svc = service(config_path, reload="label", kube=kube)
    result = svc.set(parse(ts()))
    assert result.reload is not None and result.reload.done
    assert api.nodes[NODE][CONFIG_LABEL] == "gpu-agent"
    assert svc.show().pickup.state == "unknown"


def test_restart_pod_reload_through_the_api(
    config_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    result = service(config_path, reload="restart-pod", kube=kube).set(parse(ts()))
    assert result.reload is not None and result.reload.done
    assert "nvidia-device-plugin-daemonset-abcde" not in [p.name for p in api.pods]


def test_a_restart_pod_reload_the_agent_may_not_make_is_refused_before_writing(
    config_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """With reload restart-pod and the plugin pod's delete forbidden (the overlay's Role
    missing), set wrote the file and then failed its reload with a 403: the node held a config
    its plugin had not loaded. The delete is now tried first as a dry run, which the API server
    authorizes as a real one, and a refusal writes nothing (docs/sharing.md, "Reloading the
    plugin")."""
    api, _ = kube_api
    pod = "/api/v1/namespaces/gpu-operator/pods/nvidia-device-plugin-daemonset-abcde"
    api.forbidden.add(("DELETE", pod))
    svc = service(config_path, reload="restart-pod", kube=kube)
    with pytest.raises(PermissionDenied, match="nothing was written"):
        svc.set(parse(ts()))
    assert not config_path.exists()
    assert "nvidia-device-plugin-daemonset-abcde" in [p.name for p in api.pods]
    api.forbidden.clear()
    assert svc.set(parse(ts())).reload.done  # type: ignore[union-attr]


def test_a_failed_reload_says_the_config_was_written(
    config_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.forbidden.add(("PATCH", f"/api/v1/nodes/{NODE}"))
    svc = service(config_path, reload="label", kube=kube)
    with pytest.raises(PermissionDenied, match=r"config written to .*config\.yaml, but reloading"):
        svc.set(parse(ts()))
    assert parse(config_path.read_text()) == parse(ts())
    view = svc.show()
    assert view.last_write is not None and view.last_write.reload is None
