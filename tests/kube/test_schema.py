"""The API stand-in checks bodies and what it serves against the real schema
(tests/kube/schema.py), so a field name or shape wrong in both the agent and the stand-in fails
a test: the ``kube_api`` fixture fails any test that leaves a schema failure behind. Each test
here makes one on purpose, takes it, and checks it names the field."""

from __future__ import annotations

import pytest

from agent.errors import AgentError
from agent.kube import InClusterKubeClient
from tests.kube import schema
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE


def test_a_misspelt_field_in_a_node_patch_is_a_failure(kube: InClusterKubeClient) -> None:
    """A merge patch is checked as the partial Node it is: unknown and missing fields (the
    server drops the unknown one, then refuses the taint with no effect)."""
    body = {"spec": {"taints": [{"key": "gpu-agent/failed", "efect": "NoSchedule"}]}}
    with pytest.raises(AgentError, match=r"422 .*spec\.taints\[0\]\.effect: Required value"):
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{NODE}",
            body=body,
            content_type="application/merge-patch+json",
        )
    found = schema.take()
    assert any("PATCH /api/v1/nodes" in f and "'efect' was unexpected" in f for f in found)
    assert any("'effect' is a required property" in f for f in found)
    assert all(v in " ".join(found) for v in schema.VERSIONS)  # the oldest and the newest


def test_a_wrong_type_in_an_event_is_a_failure(kube: InClusterKubeClient) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{NODE}."},
        "involvedObject": {"kind": "Node", "name": NODE},
        "count": "1",
    }
    kube.request("POST", "/api/v1/namespaces/default/events", body=event)
    found = schema.take()
    assert any("Event count" in f and "'1' is not of type 'integer'" in f for f in found), found


def test_a_body_sent_to_another_kinds_path_is_a_failure(kube: InClusterKubeClient) -> None:
    lease = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    kube.request("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases", body=lease)
    assert any("sent v1 ConfigMap to Lease's path" in f for f in schema.take())


def test_what_the_stand_in_serves_is_checked(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """A Node status a test sets wrong (as a stand-in bug would) fails when it is served."""
    api, _ = kube_api
    api.set_node_status(NODE, {"allocatable": {"nvidia.com/gpu": "8"}, "gpus": 8})
    kube.node_labels(NODE)
    found = schema.take()
    assert any(f.startswith("served by GET") and "'gpus' was unexpected" in f for f in found)


def test_a_right_lease_passes_in_every_version() -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpu-agent-coordinator", "namespace": "gpu-agent"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    assert schema.problems(lease) == []


def test_a_metadata_only_answer_is_held_to_its_go_type() -> None:
    """PartialObjectMetadata(List) is in no OpenAPI document: a stand-in that left a Node's
    status in it, a label that is no string or an item of another kind is a failure all the
    same, and a right one passes."""
    item = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata"}
    good = {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "5", "continue": "50"},
        "items": [item | {"metadata": {"name": NODE, "labels": {"pool": "a"}}}],
    }
    assert schema.problems(good) == []
    bad = good | {
        "items": [
            item | {"metadata": {"name": NODE, "labels": {"pool": 1}}, "status": {}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-2"}},
        ]
    }
    found = " ".join(schema.problems(bad))
    assert "'status' was unexpected" in found and "1 is not of type 'string'" in found
    assert "('v1', 'Node'), not its item kind" in found
