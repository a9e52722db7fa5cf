"""`gpu-agent status` of a node whose process lists were withheld from the caller's roles."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import agent_pb2
from agent.api.convert import gpu_pb
from agent.cli.status import _table, status_view
from tests.unit.sharing.layouts import full_gpu


def _node(hidden: bool) -> agent_pb2.Node:
    node = agent_pb2.Node(name="n", driver_version="550.90.07", processes_hidden=hidden)
    node.gpus.extend(gpu_pb(full_gpu(i)) for i in range(2))
    return node


def test_withheld_processes_are_shown_as_withheld_not_as_none_running() -> None:
    data = status_view(_node(hidden=True))
    assert data["processes_withheld"] is True
    assert [g["processes"] for g in data["gpus"]] == [None, None]
    text = _table(data)
    assert "withheld (read role)" in text
    assert "  none" not in text
    assert len(data["gpus"]) == 2  # the GPUs themselves are not withheld


def test_a_node_without_processes_still_says_none() -> None:
    data = status_view(_node(hidden=False))
    assert data["processes_withheld"] is False
    assert [g["processes"] for g in data["gpus"]] == [[], []]
    assert _table(data).endswith("Processes\n  none")
