"""The committed gRPC code matches proto/, imports as a package, and the protos pass buf lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED = REPO_ROOT / "agent" / "_proto"


def files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    """Regenerating from proto/ reproduces agent/_proto byte for byte."""
    fresh = tmp_path / "_proto"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen-proto"), "--out", str(fresh)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    expected, committed = files(fresh), files(GENERATED)
    stale = sorted(
        name
        for name in expected.keys() | committed.keys()
        if expected.get(name) != committed.get(name)
    )
    assert not stale, f"agent/_proto is stale ({', '.join(stale)}); run scripts/gen-proto"


def find_buf() -> str:
    beside_python = Path(sys.executable).with_name("buf")  # where the buf-bin wheel puts it
    found = str(beside_python) if beside_python.exists() else shutil.which("buf")
    if found is None:
        pytest.fail("buf not found; install the test extras (buf-bin)")
    return found


def test_buf_lint_is_clean() -> None:
    result = subprocess.run(
        [find_buf(), "lint"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_generated_modules_live_in_the_agent_package() -> None:
    """Messages belong to agent._proto; the descriptor keeps the canonical proto file name."""
    assert type(agent_pb2.Node()).__module__ == "agent._proto.gpuagent.v1.agent_pb2"
    assert agent_pb2.DESCRIPTOR.name == "gpuagent/v1/agent.proto"
    assert agent_pb2.DESCRIPTOR.package == "gpuagent.v1"


def test_optional_fields_tell_unset_from_zero() -> None:
    """A process outside MIG has no instance ids, which is not instance 0."""
    outside = agent_pb2.Process.FromString(agent_pb2.Process(pid=7).SerializeToString())
    inside = agent_pb2.Process(pid=7, gpu_instance_id=0, compute_instance_id=0)
    inside = agent_pb2.Process.FromString(inside.SerializeToString())
    assert not outside.HasField("gpu_instance_id")
    assert inside.HasField("gpu_instance_id") and inside.gpu_instance_id == 0


class FixedNode(agent_pb2_grpc.NodeServiceServicer):
    def GetNode(
        self, request: agent_pb2.GetNodeRequest, context: grpc.ServicerContext
    ) -> agent_pb2.GetNodeResponse:
        gi = agent_pb2.GpuInstance(
            id=1,
            profile_id=19,
            profile_name="1g.10gb",
            placement=agent_pb2.Placement(start=0, size=1),
            compute_instances=[agent_pb2.ComputeInstance(id=0, uuid="MIG-x")],
        )
        gpu = agent_pb2.Gpu(
            index=0, uuid="GPU-x", mig_capable=True, mig_mode=agent_pb2.MigMode(current=True)
        )
        gpu.instances.append(gi)
        return agent_pb2.GetNodeResponse(node=agent_pb2.Node(name="n1", gpus=[gpu]))


def test_a_generated_stub_calls_a_generated_servicer() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    agent_pb2_grpc.add_NodeServiceServicer_to_server(FixedNode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.NodeServiceStub(channel)
            node = stub.GetNode(agent_pb2.GetNodeRequest(), timeout=10).node
    finally:
        server.stop(grace=None)
    assert node.name == "n1"
    assert node.gpus[0].instances[0].compute_instances[0].uuid == "MIG-x"
    assert node.gpus[0].mig_mode.current and not node.gpus[0].mig_mode.pending
