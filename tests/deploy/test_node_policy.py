"""The ValidatingAdmissionPolicy that fences the agent's node patches, evaluated on requests.

The policy's own CEL expressions (from the rendered manifests) run here in a CEL interpreter
(PyPI package common-expression-language), the way the API server runs them: matchConditions
first, then the variables in order, then each validation. CEL in Kubernetes adds libraries this
interpreter lacks (none of which the policy uses, apart from `join` in a message).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.mig.labels import OPERAND_LABELS, pause_patch, restore_patch
from tests.deploy.conftest import Obj, find, render

try:
    import cel
except ImportError:  # pragma: no cover - the failure below says what to install
    cel = None

AGENT = "system:serviceaccount:gpu-agent:gpu-agent"
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def _policy(name: str = "gpu-agent-own-node-labels") -> Obj:
    if cel is None:
        pytest.fail(
            "the PyPI package common-expression-language is missing: "
            "pip install common-expression-language",
            pytrace=False,
        )
    return find(render("default"), "ValidatingAdmissionPolicy", name)


def _node(name: str = "gpu-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/mig.config": "all-1g.10gb",
                "gpu-agent.io/cache.llama-8b": "ready",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.0.1.0/24",
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
    }


def _request(user: str = AGENT, node: str | None = "gpu-1") -> dict[str, Any]:
    info: dict[str, Any] = {"username": user}
    if node is not None:
        info["extra"] = {
            NODE_EXTRA: [node],
            "authentication.kubernetes.io/pod-name": ["gpu-agent-x"],
        }
    return {"operation": "UPDATE", "subResource": "", "userInfo": info}


def _evaluate(expression: str, variables: dict[str, Any]) -> Any:
    context = cel.Context()
    for name, value in variables.items():
        context.add_variable(name, value)
    # Kubernetes CEL's strings extension, which the interpreter lacks: list.join(separator).
    context.add_function("join", lambda items, separator: separator.join(items))
    return cel.evaluate(expression, context)


def _admit(
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    request: dict[str, Any],
    policy: str = "gpu-agent-own-node-labels",
) -> list[str]:
    """The messages of the validations that fail (empty: admitted); ["not matched"] when the
    policy does not apply to the request."""
    spec = _policy(policy)["spec"]
    context: dict[str, Any] = {"object": new, "oldObject": old, "request": request}
    for condition in spec["matchConditions"]:
        if not _evaluate(condition["expression"], context):
            return ["not matched"]
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = _evaluate(
            variable["expression"], {**context, "variables": variables}
        )
    context["variables"] = variables
    failed = []
    for validation in spec["validations"]:
        if _evaluate(validation["expression"], context) is not True:
            if "messageExpression" in validation:
                failed.append(_evaluate(validation["messageExpression"], context))
            else:
                failed.append(validation["message"])
    return failed


def _labels(old: dict[str, Any], changes: dict[str, str | None]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    for key, value in changes.items():
        if value is None:
            new["metadata"]["labels"].pop(key)
        else:
            new["metadata"]["labels"][key] = value
    return new


@pytest.mark.parametrize(
    "changes",
    [
        {"gpu-agent.io/cache.mistral-7b": "ready"},
        {"gpu-agent.io/cache.llama-8b": None},
        {"nvidia.com/device-plugin.config": "gpu-agent"},
        {"nvidia.com/mig.config.state": "success"},
    ],
    ids=["add cache label", "remove cache label", "device-plugin config", "mig state"],
)
def test_agent_may_set_its_labels_on_its_own_node(changes: dict[str, str | None]) -> None:
    old = _node()
    assert _admit(old, _labels(old, changes), _request()) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"kubernetes.io/hostname": "other"},
        {"nvidia.com/gpu.present": None},
        {"nvidia.com/mig.config": "all-7g.80gb"},
        {"node-role.kubernetes.io/control-plane": ""},
    ],
    ids=["rename hostname", "drop gpu label", "mig config (the user's)", "add a role"],
)
def test_agent_may_not_touch_other_labels(changes: dict[str, str | None]) -> None:
    old = _node()
    failed = _admit(old, _labels(old, changes), _request())
    assert len(failed) == 1 and "may change only labels" in failed[0]
    assert failed[0].endswith("; not: " + ", ".join(changes)), "the message names the label"


def _operand_node(value: str) -> dict[str, Any]:
    node = _node()
    node["metadata"]["labels"].update({key: value for key in OPERAND_LABELS})
    node["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] = "true"
    return node


def test_the_policys_operand_labels_are_the_ones_the_mig_protocol_writes() -> None:
    """One list: the policy allows exactly agent/mig/labels.py's OPERAND_LABELS."""
    (variable,) = [v for v in _policy()["spec"]["variables"] if v["name"] == "operandLabels"]
    assert _evaluate(variable["expression"], {}) == list(OPERAND_LABELS)


def test_agent_may_pause_and_restore_the_gpu_operator_operands() -> None:
    """A MIG apply pauses the operands that hold the GPUs and restores them after, with the
    very patches agent/mig/labels.py builds (as NVIDIA's mig-manager does)."""
    running = _operand_node("true")
    paused = _labels(running, pause_patch(running["metadata"]["labels"]))
    assert set(pause_patch(running["metadata"]["labels"])) == set(OPERAND_LABELS)
    assert _admit(running, paused, _request()) == []
    restored = _labels(paused, restore_patch(paused["metadata"]["labels"]))
    assert restored["metadata"]["labels"] == running["metadata"]["labels"]
    assert _admit(paused, restored, _request()) == []


OPERAND_REFUSED = (
    "gpu-agent may set the operand labels nvidia.com/gpu.deploy.* only to true or "
    "paused-for-mig-change"
)


@pytest.mark.parametrize(
    "value", ["false", None, "evil"], ids=["turn off", "remove", "another value"]
)
def test_agent_may_not_turn_an_operand_off_or_remove_its_label(value: str | None) -> None:
    old = _operand_node("true")
    failed = _admit(old, _labels(old, {"nvidia.com/gpu.deploy.dcgm-exporter": value}), _request())
    assert failed == [OPERAND_REFUSED]


def test_agent_may_not_touch_operand_labels_the_mig_protocol_does_not_write() -> None:
    old = _operand_node("true")
    failed = _admit(
        old, _labels(old, {"nvidia.com/gpu.deploy.driver": "paused-for-mig-change"}), _request()
    )
    assert len(failed) == 1 and failed[0].endswith("; not: nvidia.com/gpu.deploy.driver")


def test_agent_may_not_patch_another_node() -> None:
    old = _node("gpu-2")
    new = _labels(old, {"gpu-agent.io/cache.x": "ready"})
    failed = _admit(old, new, _request(node="gpu-1"))
    assert failed == ["gpu-agent on node gpu-1 may not change node gpu-2"]


def test_a_token_without_a_node_name_is_refused() -> None:
    old = _node()
    failed = _admit(old, _labels(old, {"gpu-agent.io/cache.x": "ready"}), _request(node=None))
    assert len(failed) == 1 and "no node name" in failed[0]


SPEC_REFUSED = (
    "gpu-agent may change only its own taint (gpu-agent.io/health, NoSchedule) in a node's "
    "spec; not unschedulable, podCIDR or other taints"
)
HEALTH_TAINT = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "change",
    [
        lambda spec: spec.update(unschedulable=True),
        lambda spec: spec["taints"].append({"key": "evil", "effect": "NoExecute"}),
        lambda spec: spec["taints"].clear(),  # dropping someone else's taint
        lambda spec: spec.update(podCIDR="10.9.9.0/24"),
        lambda spec: spec["taints"].append({**HEALTH_TAINT, "effect": "NoExecute"}),
    ],
    ids=["cordon", "another taint", "drop another taint", "podCIDR", "own key, NoExecute"],
)
def test_agent_may_not_cordon_or_touch_other_taints(change: Any) -> None:
    old = _node()
    new = copy.deepcopy(old)
    change(new["spec"])
    assert _admit(old, new, _request()) == [SPEC_REFUSED]


def test_agent_may_set_and_remove_its_own_health_taint() -> None:
    old = _node()
    tainted = copy.deepcopy(old)
    tainted["spec"]["taints"].append(dict(HEALTH_TAINT))
    assert _admit(old, tainted, _request()) == []
    assert _admit(tainted, old, _request()) == []
    del old["spec"]["taints"]  # a node with no taints at all
    fresh = copy.deepcopy(old)
    fresh["spec"]["taints"] = [dict(HEALTH_TAINT)]
    assert _admit(old, fresh, _request()) == []


def _status(conditions: list[dict[str, str]]) -> dict[str, Any]:
    node = _node()
    node["status"] = {"conditions": conditions}
    return node


def test_agent_may_write_only_its_own_node_condition() -> None:
    rules = _policy()["spec"]["matchConstraints"]["resourceRules"]
    assert "nodes/status" in rules[0]["resources"]  # the status subresource is fenced too
    ready = {"type": "Ready", "status": "True"}
    old = _status([ready])
    request = {**_request(), "subResource": "status"}
    ours = _status([ready, {"type": "GPUHealthy", "status": "False"}])
    assert _admit(old, ours, request) == []
    theirs = _status([{"type": "Ready", "status": "False"}])
    assert _admit(old, theirs, request) == [
        "gpu-agent may change only its own node condition (GPUHealthy)"
    ]
    other = _status([{"type": "Ready", "status": "True"}])
    other["metadata"]["name"] = "gpu-2"
    assert _admit(_status([ready]) | {"metadata": other["metadata"]}, other, request)[0] == (
        "gpu-agent on node gpu-1 may not change node gpu-2"
    )


def test_agent_annotations_only_under_its_prefix() -> None:
    old = _node()
    ours = copy.deepcopy(old)
    ours["metadata"]["annotations"]["gpu-agent.io/mig-layout"] = "all-1g.10gb"
    assert _admit(old, ours, _request()) == []
    theirs = copy.deepcopy(old)
    theirs["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "30"
    assert _admit(old, theirs, _request()) == [
        "gpu-agent may change only annotations under gpu-agent.io/"
    ]


def test_a_node_without_labels_or_annotations_is_handled() -> None:
    old = _node()
    del old["metadata"]["labels"], old["metadata"]["annotations"]
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"gpu-agent.io/cache.x": "ready"}
    assert _admit(old, new, _request()) == []


@pytest.mark.parametrize(
    "user", ["system:node:gpu-1", "system:serviceaccount:gpu-agent:gpu-agent-coordinator", "alice"]
)
def test_other_users_are_not_this_policys_business(user: str) -> None:
    old = _node()
    new = _labels(old, {"kubernetes.io/hostname": "renamed"})
    assert _admit(old, new, _request(user=user)) == ["not matched"]


def _rule(node: str = "gpu-1", pool: str = "gpu-1", key: str = "gpu-agent.io/health") -> Obj:
    return {
        "metadata": {
            "name": f"gpu-agent.{node}.{pool}.gpu-0",
            "labels": {"gpu-agent.io/node": node},
        },
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": pool, "device": "gpu-0"},
            "taint": {"key": key, "value": "failed", "effect": "NoSchedule"},
        },
    }


def test_agent_may_write_device_taint_rules_of_its_own_node_only() -> None:
    policy = "gpu-agent-own-device-taints"
    create, delete = {**_request(), "operation": "CREATE"}, {**_request(), "operation": "DELETE"}
    assert _admit(None, _rule(), create, policy) == []
    assert _admit(_rule(), None, delete, policy) == []
    own = (
        "gpu-agent may write only DeviceTaintRules of its own node "
        "(label gpu-agent.io/node and pool)"
    )
    assert _admit(None, _rule(pool="gpu-2"), create, policy) == [own]
    assert _admit(_rule(node="gpu-2", pool="gpu-2"), None, delete, policy) == [own]
    assert _admit(None, _rule(key="evil/x"), create, policy) == [
        "gpu-agent may set only the gpu-agent.io/health device taint"
    ]
