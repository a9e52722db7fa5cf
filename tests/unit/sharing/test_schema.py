"""The device plugin's config file: parse, render, round trip (reference/mig.md §5.1).

Golden inputs under golden/readme-*.yaml are the k8s-device-plugin README's own examples;
golden/rendered-*.yaml are the exact bytes the agent writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import InvalidSpec
from agent.sharing.schema import (
    Flags,
    PluginConfig,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
    parse,
    render,
    to_document,
)

GOLDEN = Path(__file__).parent / "golden"
README_EXAMPLES = sorted(GOLDEN.glob("readme-*.yaml"))


def fields(exc: pytest.ExceptionInfo[InvalidSpec]) -> list[str]:
    return [v.field for v in exc.value.violations]


def test_readme_time_slicing_example_parses_to_ten_replicas_of_gpu() -> None:
    """The README's time-slicing example: one resource, plugin defaults for the two booleans."""
    config = parse((GOLDEN / "readme-time-slicing.yaml").read_text())
    assert config.sharing == Sharing(
        time_slicing=ReplicatedResources((ReplicatedResource("nvidia.com/gpu", 10),))
    )
    assert config.sharing.strategy == "time-slicing"
    assert config.sharing.fail_requests_greater_than_one is False
    assert config.mig_strategy == "none"


def test_readme_mps_example_defaults_fail_requests_to_true() -> None:
    """failRequestsGreaterThanOne defaults to false for time-slicing but true for MPS."""
    config = parse((GOLDEN / "readme-mps.yaml").read_text())
    assert config.sharing.strategy == "mps"
    assert config.sharing.mps is not None
    assert config.sharing.mps.fail_requests_greater_than_one is None
    assert config.sharing.fail_requests_greater_than_one is True


@pytest.mark.parametrize("name", ["readme-time-slicing-renamed.yaml", "readme-mps-renamed.yaml"])
def test_readme_renamed_examples_set_rename_by_default(name: str) -> None:
    active = parse((GOLDEN / name).read_text()).sharing.active
    assert active is not None and active.rename_by_default is True


def test_readme_flags_example_keeps_unmanaged_flags_verbatim() -> None:
    """The file is shared with the plugin: flags the agent does not manage come back unchanged."""
    text = (GOLDEN / "readme-flags.yaml").read_text()
    config = parse(text)
    assert config.flags.mig_strategy == "none"
    assert to_document(config)["flags"] == yaml.safe_load(text)["flags"]


@pytest.mark.parametrize("path", README_EXAMPLES, ids=lambda p: p.name)
def test_readme_examples_round_trip_through_render(path: Path) -> None:
    """parse(render(c)) == c for every documented example, and render is a fixed point."""
    config = parse(path.read_text())
    rendered = render(config)
    assert parse(rendered) == config
    assert render(parse(rendered)) == rendered


def test_render_matches_golden_mixed_time_slicing() -> None:
    config = parse(
        {
            "flags": {
                "plugin": {
                    "deviceListStrategy": ["envvar", "cdi-annotations"],
                    "passDeviceSpecs": False,
                },
                "failOnInitError": True,
                "migStrategy": "mixed",
            },
            "imex": {"channelIDs": [0], "required": False},
            "sharing": {
                "timeSlicing": {
                    "failRequestsGreaterThanOne": True,
                    "renameByDefault": True,
                    "resources": [
                        {"name": "gpu", "replicas": 4},
                        {"name": "nvidia.com/mig-1g.10gb", "replicas": 3},
                    ],
                }
            },
        }
    )
    assert render(config) == (GOLDEN / "rendered-mixed-time-slicing.yaml").read_text()


def test_render_matches_golden_mps() -> None:
    config = PluginConfig(
        sharing=Sharing(mps=ReplicatedResources((ReplicatedResource("nvidia.com/gpu", 2),)))
    )
    assert render(config) == (GOLDEN / "rendered-mps.yaml").read_text()


def test_render_is_independent_of_input_key_order() -> None:
    a = parse({"flags": {"b": 1, "a": 2, "migStrategy": "single"}})
    b = parse({"flags": {"migStrategy": "single", "a": 2, "b": 1}})
    assert render(a) == render(b)


def test_resource_name_gets_the_nvidia_prefix_as_the_plugin_adds_it() -> None:
    config = parse({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}})
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].name == "nvidia.com/gpu"


def test_missing_version_means_v1_and_an_empty_file_means_defaults() -> None:
    assert parse("") == PluginConfig()
    assert parse("flags: {migStrategy: single}").mig_strategy == "single"


def test_other_version_is_refused() -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse("version: v2")
    assert fields(exc) == ["version"]


def test_unknown_keys_are_refused_where_the_agent_owns_the_schema() -> None:
    """A typo must not be written to the plugin and then ignored by it."""
    with pytest.raises(InvalidSpec) as exc:
        parse(
            {
                "sharng": {},
                "sharing": {
                    "timeslicing": {},
                    "mps": {"renameDefault": True, "resources": [{"name": "gpu", "replica": 2}]},
                },
            }
        )
    assert sorted(fields(exc)) == [
        "sharing.mps.renameDefault",
        "sharing.mps.resources[0].replica",
        "sharing.mps.resources[0].replicas",
        "sharing.timeslicing",
        "sharng",
    ]


def test_unmanaged_sections_and_flags_are_kept() -> None:
    config = parse(
        {"flags": {"gdsEnabled": True}, "imex": {"channelIDs": [0]}, "resources": {"gpus": []}}
    )
    doc = to_document(config)
    assert doc["flags"] == {"gdsEnabled": True}
    assert doc["imex"] == {"channelIDs": [0]}
    assert doc["resources"] == {"gpus": []}


def test_required_keys_and_types_are_checked_with_every_violation_listed() -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse(
            {
                "flags": {"migStrategy": "both"},
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": "yes",
                        "failRequestsGreaterThanOne": 1,
                        "resources": [
                            {"replicas": 2},
                            {"name": "gpu", "replicas": "4"},
                            {"name": "gpu", "replicas": True},
                            {"name": "gpu", "replicas": 2, "devices": {"a": 1}},
                            "gpu=2",
                        ],
                    }
                },
            }
        )
    assert fields(exc) == [
        "flags.migStrategy",
        "sharing.timeSlicing.resources[0].name",
        "sharing.timeSlicing.resources[1].replicas",
        "sharing.timeSlicing.resources[2].replicas",
        "sharing.timeSlicing.resources[3].devices",
        "sharing.timeSlicing.resources[4]",
        "sharing.timeSlicing.renameByDefault",
        "sharing.timeSlicing.failRequestsGreaterThanOne",
    ]


def test_resources_must_be_a_list() -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse({"sharing": {"timeSlicing": {"resources": {"name": "gpu"}}}})
    assert fields(exc) == ["sharing.timeSlicing.resources"]


def test_yaml_syntax_error_is_an_invalid_spec() -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse("sharing: [unclosed")
    assert fields(exc) == ["config"]


def test_document_must_be_a_mapping() -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse("- a list")
    assert fields(exc) == ["config"]


def test_parsed_config_is_not_changed_by_its_source_dict() -> None:
    source: dict[str, object] = {"flags": {"plugin": {"passDeviceSpecs": False}}}
    config = parse(source)
    source["flags"]["plugin"]["passDeviceSpecs"] = True  # type: ignore[index]
    assert to_document(config)["flags"] == {"plugin": {"passDeviceSpecs": False}}


_names = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"])
_sections = st.builds(
    ReplicatedResources,
    resources=st.lists(
        st.builds(ReplicatedResource, name=_names, replicas=st.integers(2, 64)), max_size=3
    ).map(tuple),
    rename_by_default=st.booleans(),
    fail_requests_greater_than_one=st.none() | st.booleans(),
)
_configs = st.builds(
    PluginConfig,
    flags=st.builds(
        Flags,
        mig_strategy=st.none() | st.sampled_from(["none", "single", "mixed"]),
        other=st.dictionaries(
            st.sampled_from(["failOnInitError", "nvidiaDriverRoot", "gdsEnabled"]),
            st.booleans() | st.text(alphabet="abc/-", max_size=5),
        ),
    ),
    sharing=st.builds(Sharing, time_slicing=st.none() | _sections, mps=st.none() | _sections),
)


@given(_configs)
def test_any_config_round_trips_through_render(config: PluginConfig) -> None:
    assert parse(render(config)) == config
