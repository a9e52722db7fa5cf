"""The desired-state file of `coordinator serve`, and the loop's health and metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format

from agent._proto.gpuagent.v1 import agent_pb2, prewarm_pb2
from agent.coordinator.control.desired import parse_desired
from agent.coordinator.control.reconcile import Reconciler
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import StaticDiscovery
from agent.coordinator.rollout.specs import sharing_spec
from agent.errors import InvalidSpec

REPO = Path(__file__).resolve().parents[3]

FULL = """\
version: v1
rollout: {max_unavailable: 10%, max_failures: 2, node_timeout_s: 600}
mig:
  - selector: model=*H100*
    config: |
      version: v1
      mig-configs:
        all-1g: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}]
sharing:
  - selector: pool=inference
    strategy: mps
    replicas: 3
prewarm:
  - concurrency: 5
    files: [{url: "https://models.example/a.bin", sha256: "", name: a}]
    images: [{ref: "registry.example/app:1", name: app}]
"""


def test_a_full_desired_state_parses() -> None:
    desired = parse_desired(FULL)
    assert desired.rollout.max_unavailable == "10%" and desired.rollout.max_failures == 2
    (mig,) = desired.mig
    assert mig.config_name == "all-1g" and str(mig.selector) == "model=*H100*"
    (share,) = desired.sharing
    assert share.request["spec"]["strategy"] == "SHARING_STRATEGY_MPS"
    # one builder: the request `fleet apply --sharing mps --replicas 3` would record
    assert share.request == sharing_spec(None, "mps", ["nvidia.com/gpu"], 3)["request"]
    (warm,) = desired.prewarm
    assert warm.names == ("a", "app") and warm.concurrency == 5


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("version: v2", "version"),
        ("version: v1\nextra: 1", "extra"),
        ("version: v1\nrollout: {max_unavailable: 0}", "rollout.max_unavailable"),
        ("version: v1\nsharing: [{strategy: magic, replicas: 2}]", "sharing[0].strategy"),
        ("version: v1\nsharing: [{strategy: mps, replicas: 1}]", "sharing[0].replicas"),
        # every agent refuses more than 48 MPS clients: refused once, at load
        ("version: v1\nsharing: [{strategy: mps, replicas: 100}]", "sharing[0]"),
        (
            "version: v1\nsharing: [{strategy: mps, replicas: 2, resources: nvidia.com/gpu}]",
            "sharing[0].resources",
        ),
        ("version: v1\nmig: [{config: 'version: v1'}]", "mig[0].config"),
        ("version: v1\nmig: [{selector: 'model', config: 'x'}]", "mig[0].selector"),
        ("version: v1\nprewarm: [{files: [{url: 'https://x/a'}]}]", "prewarm[0].files[0].name"),
        ("version: v1\nprewarm: [{concurrency: 0, files: []}]", "prewarm[0].concurrency"),
    ],
)
def test_a_bad_desired_state_names_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(text)
    assert field in [v.field for v in caught.value.violations], caught.value.violations


def test_a_mig_rule_whose_file_holds_two_configs_names_its_config_name() -> None:
    """The refusal named mig-parted's `selected-config` flag, which the desired file does not
    have; the field to set is the rule's own config_name."""
    off = "[{devices: all, mig-enabled: false}]"
    two = f"version: v1\nmig-configs:\n  a: {off}\n  b: {off}\n"
    text = yaml.safe_dump({"version": "v1", "mig": [{"selector": "pool=x", "config": two}]})
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(text)
    said = " ".join(v.description for v in caught.value.violations)
    assert "mig[0].config_name" in said and "selected-config" not in said, said


MODELS = """\
version: v1
prewarm:
  - selector: pool=inference
    files: [{url: "https://models.example/a.bin", name: a}]
    models:
      - repo: org-a/Tiny-Llama
        revision: v1.0
        include: ["*.json", "*.safetensors"]
        name: tiny
        pin: true
        header_files: {Authorization: /var/run/secrets/hf/header}
      - {repo: org-b/other, endpoint: "https://hub.example", name: other}
"""


def test_models_parse_into_model_targets_beside_files() -> None:
    """`models:` entries become ModelTargets, sent to each node as `model` targets and
    listed under their names (the node's ``cache.<name>`` label)."""
    (rule,) = parse_desired(MODELS).prewarm
    assert rule.names == ("a", "tiny", "other")
    sent = [json_format.ParseDict(t, prewarm_pb2.PrewarmTarget()) for t in rule.targets]
    assert [t.WhichOneof("target") for t in sent] == ["file", "model", "model"]
    tiny = sent[1].model
    assert (tiny.repo, tiny.revision, list(tiny.include), tiny.name, tiny.pin) == (
        "org-a/Tiny-Llama",
        "v1.0",
        ["*.json", "*.safetensors"],
        "tiny",
        True,
    )
    assert dict(tiny.header_files) == {"Authorization": "/var/run/secrets/hf/header"}
    assert (sent[2].model.endpoint, sent[2].model.revision) == ("https://hub.example", "")


def _models(*entries: str) -> str:
    return "version: v1\nprewarm:\n  - models:\n" + "".join(f"    - {e}\n" for e in entries)


GOOD = "{repo: org/m, name: m}"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_models(GOOD, "{name: n}"), "prewarm[0].models[1].repo"),
        (_models(GOOD, "{repo: '', name: n}"), "prewarm[0].models[1].repo"),
        (_models("{repo: ../../etc, name: n}"), "prewarm[0].models[0].repo"),
        (_models("{repo: 'a/b/c', name: n}"), "prewarm[0].models[0].repo"),
        (_models("{repo: org/m, revision: '../x', name: n}"), "prewarm[0].models[0].revision"),
        (_models("{repo: org/m}"), "prewarm[0].models[0].name"),
        (_models("{repo: org/m, name: 'a/b'}"), "prewarm[0].models[0].name"),
        (_models(GOOD, "{repo: org/n, name: m}"), "prewarm[0].models[1].name"),
        (_models("{repo: org/m, name: m, include: [''] }"), "prewarm[0].models[0].include"),
        (
            _models("{repo: org/m, name: m, include: %s}" % (["g"] * 65)),
            "prewarm[0].models[0].include",
        ),
        (
            _models("{repo: org/m, name: m, endpoint: 'file:///etc'}"),
            "prewarm[0].models[0].endpoint",
        ),
        (
            _models("{repo: org/m, name: m, header_files: {Authorization: token}}"),
            "prewarm[0].models[0].header_files[Authorization]",
        ),
        (
            _models("{repo: org/m, name: m, header_files: {'bad header': /x}}"),
            "prewarm[0].models[0].header_files",
        ),
        (_models("{repo: org/m, name: m, sha256: abc}"), "prewarm[0].models[0]"),
        (_models("{repo: [org/m], name: m}"), "prewarm[0].models[0]"),
        (_models("org/m"), "prewarm[0].models[0]"),
        ("version: v1\nprewarm: [{models: {repo: org/m}}]", "prewarm[0].models"),
        ("version: v1\nprewarm: [{modles: []}]", "prewarm[0].modles"),
        ("version: v1\nprewarm: [{models: []}]", "prewarm[0]"),
    ],
)
def test_a_bad_model_names_its_field_and_keeps_nothing(text: str, field: str) -> None:
    """Hostile entries are refused with the field path of the entry at fault; no rule of the
    file is kept (the loop keeps its last good desired state)."""
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(text)
    assert field in [v.field for v in caught.value.violations], caught.value.violations


def test_a_rule_with_more_targets_than_one_request_takes_is_refused() -> None:
    many = ", ".join(f"{{repo: org/m{i}, name: m{i}}}" for i in range(1001))
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(f"version: v1\nprewarm: [{{models: [{many}]}}]")
    assert [v.field for v in caught.value.violations] == ["prewarm[0].models"]


async def _serve_without_agents(tmp_path: Path) -> None:
    now = [1000.0]
    fleet = Fleet(StaticDiscovery([f"unix:{tmp_path / 'none.sock'}"]), None, timeout_s=0.5)
    desired = tmp_path / "desired.yaml"
    reconciler = Reconciler(fleet, desired, interval_s=10, clock=lambda: now[0])
    try:
        assert reconciler.healthy() == (True, "ok")
        await reconciler.pass_once()  # no desired file: it only watches
        assert reconciler.stats.nodes["unreachable"] == 1
        desired.write_text("version: v9")
        await reconciler.pass_once()  # a bad file: kept out, and said so
        text = (await reconciler.metrics(None)).body.decode()  # type: ignore[arg-type]
        assert 'gpu_agent_coordinator_reconcile_passes_total{result="ok"} 2.0' in text
        assert "gpu_agent_coordinator_desired_state_valid 0.0" in text
        now[0] += 61
        healthy, why = reconciler.healthy()
        assert not healthy and "the reconcile loop made no progress for 61 s" in why
    finally:
        await fleet.close()


def test_the_loop_is_healthy_while_passes_end_and_reports_a_bad_desired_file(
    tmp_path: Path,
) -> None:
    asyncio.run(_serve_without_agents(tmp_path))


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("files: [{name: f}]", "prewarm[0].files[0].url"),
        ("images: [{name: i}]", "prewarm[0].images[0].ref"),
        (
            "images: [{ref: r.example/a:1, name: i, repull_hours: -1}]",
            "prewarm[0].images[0].repull_hours",
        ),
        (
            "files: [{url: 'https://x/a', name: f, header_files: {Authorization: token}}]",
            "prewarm[0].files[0].header_files[Authorization]",
        ),
    ],
)
def test_a_target_every_agent_would_refuse_is_refused_once_at_load(entry: str, field: str) -> None:
    """The agent's own target checks (the shared target schema, agent/prewarm/target.py) run on
    the desired file as it loads, instead of each node refusing the same target."""
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(f"version: v1\nprewarm: [{{{entry}}}]")
    assert field in [v.field for v in caught.value.violations], caught.value.violations


def test_the_shipped_example_binds_its_mig_layout_only_to_the_gpus_whose_profiles_it_names() -> (
    None
):
    """examples/desired.yaml's layout names H100 NVL profiles (1g.12gb, 3g.47gb): its rule
    picked every H100 (`model=*H100*`), so on an H100 80GB node the rollout failed with
    "1g.12gb not a profile". The rule now picks the NVL alone, and plans there."""
    from agent.coordinator.fleet.discovery import Target
    from agent.coordinator.fleet.inventory import node_view
    from agent.gpu.models import MODELS, profile_name
    from agent.mig.spec import parse_spec
    from agent.wire.node import gpu_pb, node_from
    from tests.unit.coordinator.fleets import gpu

    desired = parse_desired((REPO / "examples" / "desired.yaml").read_text())
    (rule,) = desired.mig

    def picked(model: str) -> bool:
        node = agent_pb2.Node(name="n", gpus=[gpu_pb(gpu("n", 0, model, mig=(False, False)))])
        return rule.selector.matches(node_view(Target("10.0.0.1:9401"), node_from(node)))

    assert picked("H100-NVL-94GB")
    assert not picked("H100-SXM5-80GB")
    _, entries = parse_spec(rule.config_yaml).select(rule.config_name)
    asked = {name for entry in entries for name, _ in entry.mig_devices}
    nvl = MODELS["H100-NVL-94GB"]
    assert asked <= {profile_name(nvl, gi) for gi in nvl.gi_profiles}, asked
