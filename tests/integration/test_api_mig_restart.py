"""kill -9 of the agent in the middle of a MIG apply: after the restart GetOperation reports how it
ended (finished, rolled back, or failed with a reason), never "running" forever, and no GPU is
left half-done.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
)
from agent.gpu import open_driver
from agent.mig.desired import Desired
from agent.mig.plan import mismatches
from agent.mig.state import fetch
from tests.unit.api.support import AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

CONFIG = """\
version: v1
mig-configs:
  all-1g:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.10gb: 7
"""


WANTED = Desired(True, (("1g.10gb", 7),))


def layouts(agent: AgentProcess) -> dict[str, object]:
    driver = open_driver(agent.preset, agent.state_dir)
    try:
        return {g.uuid: fetch(driver.layout(g.uuid)) for g in driver.gpus()}
    finally:
        driver.close()


def test_kill_9_during_mig_apply_is_reported_honestly_after_the_restart(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        with unix_channel(agent.socket) as channel:
            before = layouts(agent)
            mig = mig_pb2_grpc.MigServiceStub(channel)
            ops = operations_pb2_grpc.OperationsServiceStub(channel)
            op = mig.ApplyMig(
                mig_pb2.ApplyMigRequest(config_yaml=CONFIG, config_name="all-1g", request_id="a1"),
                timeout=30,
            ).operation

            def half_way() -> bool:
                now = ops.GetOperation(
                    operations_pb2.GetOperationRequest(name=op.name), timeout=10
                ).operation
                progress = now.metadata.mig_apply
                return now.done or (progress.steps_done > 0 and not now.done)

            wait_for(half_way, "the apply to be under way", 60, 0.01)
        agent.kill()
        agent.start()
        with unix_channel(agent.socket) as channel:
            ops = operations_pb2_grpc.OperationsServiceStub(channel)
            ended = ops.GetOperation(
                operations_pb2.GetOperationRequest(name=op.name), timeout=10
            ).operation
            assert ended.done, ended
            assert ended.state in (
                operations_pb2.OPERATION_STATE_SUCCEEDED,
                operations_pb2.OPERATION_STATE_FAILED,
                operations_pb2.OPERATION_STATE_CANCELLED,
            )
            if ended.state != operations_pb2.OPERATION_STATE_SUCCEEDED:
                assert ended.error.reason and ended.error.message
            check = mig_pb2_grpc.MigServiceStub(channel).AssertMig(
                mig_pb2.AssertMigRequest(config_yaml=CONFIG, config_name="all-1g"), timeout=30
            )
        # Each GPU is either as the config asks or exactly as it was before: never in between.
        driver = open_driver(agent.preset, agent.state_dir)
        try:
            for gpu in driver.gpus():
                layout = driver.layout(gpu.uuid)
                if mismatches(layout, WANTED):
                    assert fetch(layout) == before[gpu.uuid], f"GPU {gpu.index} left half-done"
        finally:
            driver.close()
        assert check.matches == (ended.state == operations_pb2.OPERATION_STATE_SUCCEEDED)
    except grpc.RpcError as exc:
        raise AssertionError(f"{exc}\n{agent.output()}") from exc
    finally:
        agent.stop()
