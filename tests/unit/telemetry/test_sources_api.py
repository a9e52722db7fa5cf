"""A degraded collection source reaches API clients with its reason: the telemetry snapshot
carries each source's state as ``gpu_agent_collection_source_up{source,reason}`` does, and
``gpu-agent metrics --sources`` prints it as a table or JSON."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from click.testing import CliRunner

from agent._proto.gpuagent.v1 import telemetry_pb2_grpc
from agent.api.auth import Policy
from agent.api.interceptor import ApiInterceptor
from agent.api.telemetry import TelemetryServicer
from agent.cli.context import CliContext
from agent.cli.metrics import metrics
from agent.client import AgentClient
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.snapshot import Snapshot, SourceStatus
from agent.telemetry.stats import TelemetryStats
from agent.wire.telemetry import TelemetryView
from tests.unit.telemetry.simnode import sim_node


def _over_grpc(snapshot: Snapshot, socket: Path) -> TelemetryView:
    """The agent's TelemetryServicer and interceptor on a real Unix socket; the CLI's client."""

    async def run() -> TelemetryView:
        server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
        telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(
            TelemetryServicer(lambda: snapshot, lambda _feature: None), server
        )
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
        client = AgentClient(socket)
        try:
            return await asyncio.to_thread(client.telemetry)
        finally:
            client.close()
            await server.stop(None)

    return asyncio.run(run())


def test_a_broken_reader_arrives_with_its_reason_over_the_api(tmp_path: Path) -> None:
    """The pods reader has no kubelet socket: the client sees it degraded with the sampler's
    reason, and every other source up."""
    node = sim_node(tmp_path / "state")
    absent = tmp_path / "absent.sock"
    watcher = PodWatcher(PodResourcesClient(absent), absent, 60, TelemetryStats())
    watcher.refresh()
    snapshot = node.sampler(pods=watcher).tick()
    view = _over_grpc(snapshot, tmp_path / "agent.sock")
    reason = f"no kubelet pod-resources socket at {absent}"
    assert SourceStatus("pods", reason) in view.sources
    assert view.sources == snapshot.sources
    others = [s for s in view.sources if s.source != "pods"]
    assert others and all(s.degraded is None for s in others)
    assert {"devices", "gpm", "processes"} <= {s.source for s in others}


def _context(state_dir: Path) -> CliContext:
    env = {"GPU_AGENT_TELEMETRY__KUBELET_SOCKET": str(state_dir / "absent.sock")}
    return CliContext(None, {"simulate": "dgx-h100", "state_dir": state_dir}, env=env)


def test_metrics_sources_shows_the_degraded_source_as_a_table_and_json(tmp_path: Path) -> None:
    """The embedded agent's NVML event set cannot be opened: `metrics --sources` names the xid
    source degraded, and why, in both forms; `-o` alone is refused (the scrape body has one
    form). Off Kubernetes, with no kubelet socket, the pods source is up: no pod holds a GPU."""
    open_driver("dgx-h100", tmp_path).close()
    SimControl(tmp_path).inject_fault("nvmlEventSetCreate", "Unknown", count=1000)
    ctx = _context(tmp_path)
    try:
        as_json = CliRunner().invoke(metrics, ["--sources", "-o", "json"], obj=ctx)
        as_table = CliRunner().invoke(metrics, ["--sources"], obj=ctx)
    finally:
        ctx.close()
    assert as_json.exit_code == 0, as_json.output
    rows = {r["source"]: r for r in json.loads(as_json.output)}
    reason = rows["xid"]["reason"]
    assert rows["xid"]["up"] is False
    assert reason.startswith("cannot open the NVML event set:"), reason
    assert rows["devices"] == {"source": "devices", "up": True, "reason": None}
    assert rows["pods"] == {"source": "pods", "up": True, "reason": None}
    assert as_table.exit_code == 0, as_table.output
    lines = as_table.output.splitlines()
    assert lines[0].split() == ["SOURCE", "STATE", "REASON"]
    (xid,) = [line for line in lines if line.startswith("xid ")]
    assert xid.split(None, 2) == ["xid", "degraded", reason]
    assert any(line.split() == ["devices", "up", "-"] for line in lines)
    ctx = _context(tmp_path)
    try:
        alone = CliRunner().invoke(metrics, ["-o", "json"], obj=ctx)
    finally:
        ctx.close()
    assert (
        alone.exit_code != 0
        and "--output: only with --sources" in str(alone.exception or "") + alone.output
    )


def test_metrics_sources_refuses_openmetrics_rather_than_ignoring_it(tmp_path: Path) -> None:
    """`--sources` prints a table (or -o json/yaml), never the exposition: `--openmetrics` with
    it was silently ignored, so a script asking for both got a table and exit 0. Refused like
    `-o` without `--sources` (exit 2 from `gpu-agent`), before any agent is started."""
    ctx = _context(tmp_path)
    try:
        both = CliRunner().invoke(metrics, ["--sources", "--openmetrics"], obj=ctx)
    finally:
        ctx.close()
    assert both.exit_code != 0, both.output
    assert "--openmetrics: not with --sources" in str(both.exception or "") + both.output
