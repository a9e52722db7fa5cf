"""The attacker's requests over the real API (Unix socket, in-process agent on a simulated node):
every YAML field refuses a billion laughs, deep nesting, a list as a mapping key, a 5000-digit
integer and a huge string with INVALID_ARGUMENT naming the field, quickly, in little memory, with
a small error, and changes nothing: the plugin file is never written and GetSharing still works
(issue 16)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc, sharing_pb2, sharing_pb2_grpc
from tests.unit.api.support import InProcessAgent, agent_config
from tests.unit.test_safeyaml import billion_laughs

ATTACKS = {
    "billion-laughs": billion_laughs(),
    "deep-nesting": "[" * 100_000 + "]" * 100_000,
    "list-as-key": "version: v1\nmig-configs:\n  ? [a, b]\n  : []\n",
    "5000-digits": "version: v1\nmig-configs:\n  a:\n  - devices: [" + "7" * 5000 + "]\n",
    "huge-string": "version: v1\nmig-configs:\n  " + "a" * 500_000 + ": []\n",
    "cycle": "version: v1\nmig-configs: &a {x: [*a]}\n",
}


@pytest.fixture(scope="module")
def agent() -> Iterator[InProcessAgent]:
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        with InProcessAgent(root, agent_config(root)) as running:
            yield running


@pytest.fixture(scope="module")
def channel(agent: InProcessAgent) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{agent.socket}") as ch:
        yield ch


def calls(channel: grpc.Channel) -> dict[str, Callable[[str], object]]:
    mig = mig_pb2_grpc.MigServiceStub(channel)
    sharing = sharing_pb2_grpc.SharingServiceStub(channel)
    return {
        "PlanMig": lambda y: mig.PlanMig(mig_pb2.PlanMigRequest(config_yaml=y), timeout=30),
        "ApplyMig": lambda y: mig.ApplyMig(mig_pb2.ApplyMigRequest(config_yaml=y), timeout=30),
        "AssertMig": lambda y: mig.AssertMig(mig_pb2.AssertMigRequest(config_yaml=y), timeout=30),
        "SetSharing": lambda y: sharing.SetSharing(
            sharing_pb2.SetSharingRequest(config_yaml=y), timeout=30
        ),
    }


def field_violations(exc: grpc.RpcError) -> list[error_details_pb2.BadRequest.FieldViolation]:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None
    found = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            found += bad.field_violations
    return found


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("rpc", ["PlanMig", "ApplyMig", "AssertMig", "SetSharing"])
def test_hostile_yaml_is_invalid_argument_quickly_small_and_changes_nothing(
    agent: InProcessAgent, channel: grpc.Channel, rpc: str, attack: str
) -> None:
    plugin = agent.config.sharing.config_path
    rss = psutil.Process().memory_info().rss
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        calls(channel)[rpc](ATTACKS[attack])
    elapsed = time.monotonic() - started
    exc = caught.value
    assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    assert elapsed < 10.0
    assert psutil.Process().memory_info().rss - rss < 64 * 1024 * 1024
    assert len(exc.details() or "") <= 1024
    trailer = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert len(trailer.get("grpc-status-details-bin", b"")) < 8 * 1024
    violations = field_violations(exc)
    assert violations and violations[0].field.startswith("config_yaml")
    assert not plugin.exists()
    sharing_pb2_grpc.SharingServiceStub(channel).GetSharing(
        sharing_pb2.GetSharingRequest(), timeout=10
    )


def test_replicas_past_uint32_are_refused_and_get_sharing_still_works(
    agent: InProcessAgent, channel: grpc.Channel
) -> None:
    """8 GPUs x 2**31 replicas passes 2**32-1: refused before the plugin file is written."""
    stub = sharing_pb2_grpc.SharingServiceStub(channel)
    request = sharing_pb2.SetSharingRequest(
        spec=sharing_pb2.SharingSpec(
            strategy=sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=2**31)],
        )
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.SetSharing(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in field_violations(caught.value)] == [
        "sharing.timeSlicing.resources[0].replicas"
    ]
    assert not agent.config.sharing.config_path.exists()
    view = stub.GetSharing(sharing_pb2.GetSharingRequest(), timeout=10)
    assert view.config.strategy == sharing_pb2.SHARING_STRATEGY_NONE


def test_mps_replicas_above_the_plugins_client_limit_are_refused(
    agent: InProcessAgent, channel: grpc.Channel
) -> None:
    stub = sharing_pb2_grpc.SharingServiceStub(channel)
    request = sharing_pb2.SetSharingRequest(
        spec=sharing_pb2.SharingSpec(
            strategy=sharing_pb2.SHARING_STRATEGY_MPS,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=49)],
        )
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.SetSharing(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 48" in field_violations(caught.value)[0].description
    assert not agent.config.sharing.config_path.exists()


def test_a_config_yaml_with_flags_the_plugin_cannot_parse_is_refused_over_the_api(
    agent: InProcessAgent, channel: grpc.Channel
) -> None:
    """SetSharing(config_yaml) is checked with the plugin's own types, like `share set -f`:
    INVALID_ARGUMENT naming each field, and no file written for the plugin to choke on."""
    stub = sharing_pb2_grpc.SharingServiceStub(channel)
    config = (
        "version: v1\nflags:\n  failOnInitError: 'false'\n  gfd: {sleepInterval: 1 minute}\n"
        "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=config), timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(v.field for v in field_violations(caught.value)) == [
        "flags.failOnInitError",
        "flags.gfd.sleepInterval",
    ]
    assert not agent.config.sharing.config_path.exists()


def test_an_agent_whose_plugin_config_path_is_a_directory_starts_and_says_so(
    tmp_path: Path,
) -> None:
    """A directory at sharing.config_path (a hostPath mounted where the file should be) stopped
    the agent from starting: its inventory's first read of the sharing view raised
    IsADirectoryError. The agent now starts, and GetSharing is FAILED_PRECONDITION naming the
    path (docs/sharing.md, "Files")."""
    config = agent_config(tmp_path)
    (tmp_path / "plugin" / "config.yaml").mkdir()
    with (
        InProcessAgent(tmp_path, config) as running,
        grpc.insecure_channel(f"unix:{running.socket}") as channel,
    ):
        with pytest.raises(grpc.RpcError) as caught:
            sharing_pb2_grpc.SharingServiceStub(channel).GetSharing(
                sharing_pb2.GetSharingRequest(), timeout=10
            )
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "config.yaml is a directory" in (caught.value.details() or "")


@pytest.mark.parametrize(
    "extra",
    [{"rename_by_default": True}, {"fail_requests_greater_than_one": False}],
    ids=["rename_by_default", "fail_requests_greater_than_one"],
)
def test_a_spec_with_a_mig_strategy_and_section_options_but_no_resources_is_refused(
    agent: InProcessAgent, channel: grpc.Channel, extra: dict[str, bool]
) -> None:
    """A SharingSpec with ``mig_strategy`` and ``rename_by_default`` (or
    ``fail_requests_greater_than_one``) but no strategy or resources was taken as "the MIG
    strategy alone": the strategy was written and the other field dropped without a word. It
    is now refused naming the fields it lacks, and nothing is written (docs/sharing.md,
    "What `set` changes")."""
    stub = sharing_pb2_grpc.SharingServiceStub(channel)
    request = sharing_pb2.SetSharingRequest(
        spec=sharing_pb2.SharingSpec(mig_strategy="mixed", **extra)
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.SetSharing(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert {v.field for v in field_violations(caught.value)} == {"spec.strategy", "spec.resources"}
    assert not agent.config.sharing.config_path.exists()
