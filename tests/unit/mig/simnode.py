"""A simulated node with a MigService on it, as the CLI and the agent compose one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl
from agent.mig.lock import PartitionLock
from agent.mig.reset import ResetFn, simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import MigSpec, parse_spec
from agent.mig.state import GpuMigState, fetch
from agent.state import StateStore


class Killed(BaseException):
    """Stands in for SIGKILL inside an apply: no ``except Exception`` sees it, nothing is
    rolled back, the journal stays for the next start."""


#: "before", one whole 7g.94gb per GPU, and "after", seven 1g.12gb (an H100 NVL node): a
#: change that destroys and creates on every GPU.
WHOLE_THEN_SEVENTHS: MigSpec = parse_spec("""
version: v1
mig-configs:
  before:
    - {devices: all, mig-enabled: true, mig-devices: {7g.94gb: 1}}
  after:
    - {devices: all, mig-enabled: true, mig-devices: {1g.12gb: 7}}
""")


@dataclass
class SimNode:
    state_dir: Path
    driver: GpuDriver
    control: SimControl
    store: StateStore
    service: MigService

    def states(self) -> dict[str, GpuMigState]:
        """Every GPU's exact MIG state, by UUID."""
        return {g.uuid: fetch(self.driver.layout(g.uuid)) for g in self.driver.gpus()}

    def close(self) -> None:
        self.store.close()
        self.driver.close()


def sim_node(state_dir: Path, preset: str, reset: ResetFn | None = None) -> SimNode:
    driver = open_driver(preset, state_dir)
    store = StateStore(state_dir / "agent.db")
    service = MigService(
        driver, store, PartitionLock(state_dir), reset or simulated_reset(state_dir)
    )
    return SimNode(state_dir, driver, SimControl(state_dir), store, service)
