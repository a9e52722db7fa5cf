"""A restarted agent is seen again within 5 s, however long it was down: the coordinator's
channels cap gRPC's reconnect back-off (its default grows to 120 s). A real agent process over
mTLS is killed, kept down for 30 s while the coordinator keeps asking, and restarted on the
same port."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from agent.client import AsyncAgentClient as AgentClient
from agent.client import ClientTls, Unreachable
from tests.unit.api.support import AgentProcess, Pki, agent_config

pytestmark = pytest.mark.integration

OUTAGE_S = 30.0


def test_a_restarted_agent_is_seen_within_5_s_after_a_long_outage(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    config = agent_config(tmp_path / "n1", pki, node_name="n1")
    agent = AgentProcess(tmp_path / "n1", config).start(timeout=120)
    # The restart must come back on the same address, as a pod's agent does.
    doc = yaml.safe_load(config.read_text())
    doc["grpc_listen"] = f"127.0.0.1:{agent.tcp_port}"
    config.write_text(yaml.safe_dump(doc))
    tls = ClientTls(pki.coordinator.cert, pki.coordinator.key, pki.ca)

    async def main() -> float:
        client = AgentClient(f"127.0.0.1:{agent.tcp_port}", tls, timeout_s=5.0)
        try:
            assert (await client.node()).name == "n1"
            agent.kill()
            down_until = time.monotonic() + OUTAGE_S
            while time.monotonic() < down_until:  # the outage, with the coordinator asking
                with pytest.raises(Unreachable):
                    await client.node()
                await asyncio.sleep(1.0)
            await asyncio.to_thread(agent.start, 120)
            back = time.monotonic()
            while True:
                try:
                    await client.node()
                    return time.monotonic() - back
                except Unreachable:
                    await asyncio.sleep(0.1)
        finally:
            await client.close()

    try:
        seen_after = asyncio.run(main())
    finally:
        agent.stop()
    assert seen_after <= 5.0, f"the restarted agent was seen only after {seen_after:.1f} s"
