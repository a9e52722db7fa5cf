"""Crash safety of MIG applies: an NVML error, or a SIGKILL, at every mutation point.

For each scenario a first apply records its mutation points. Then, for every point, a fresh
simulated node is brought to the "before" layout and the "after" apply is failed there:

* (a) the simulator fails that NVML call (``SimControl.inject_fault``), or the reset raises;
  the apply must roll back by itself;
* (b) the applying process (a subprocess) SIGKILLs itself right before that mutation, or right
  after a GPU's last one; ``MigService.recover()`` in a new process must restore the node.

Afterwards every GPU holds exactly its old layout (same instances, placements and compute
instances: no leak), ``mig assert`` agrees, and no journal is left.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.errors import AgentError, Busy
from agent.gpu.types import GpuInfo
from agent.mig.apply import SCOPE, ProgressEvent
from agent.mig.spec import parse_spec
from tests.unit.mig.simnode import SimNode, sim_node

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]

# The NVML function each mutation calls, and a realistic error for it.
FAULTS = {
    "destroy-ci": ("nvmlComputeInstanceDestroy", "InUse"),
    "destroy-gi": ("nvmlGpuInstanceDestroy", "InUse"),
    "set-mode": ("nvmlDeviceSetMigMode", "Unknown"),
    "create-gi": ("nvmlDeviceCreateGpuInstanceWithPlacement", "InsufficientResources"),
    "create-ci": ("nvmlGpuInstanceCreateComputeInstance", "InsufficientResources"),
}


@dataclass(frozen=True)
class Scenario:
    preset: str
    config: str  # a v1 file with configs "before" and "after"
    #: extra setup after "before" is applied (processes, holder daemons)
    setup: Callable[[SimNode], None] = lambda node: None


def _busy_on_kept_3g(node: SimNode) -> None:
    # A workload on the 3g instance that stays: the apply must work around it.
    gpu0 = node.driver.gpus()[0]
    (gi,) = [g for g in node.driver.layout(gpu0.uuid).instances if g.profile_name == "3g.47gb"]
    node.control.start_process(4242, 0, used_memory_mib=1024, gpu_instance=gi.id)


def _persistenced(node: SimNode) -> None:
    # A daemon holds GPU 0: the driver cannot switch the mode itself (IN_USE), a reset must.
    node.control.add_holder(0, "nvidia-persistenced")


SCENARIOS = {
    "repartition-two-gpus": Scenario(
        "h100-nvl",
        """
version: v1
mig-configs:
  before:
    - {devices: [0], mig-enabled: true, mig-devices: {1g.12gb: 2, 2g.24gb: 1, 3g.47gb: 1}}
    - {devices: [1], mig-enabled: true, mig-devices: {7g.94gb: 1}}
  after:
    - {devices: [0], mig-enabled: true, mig-devices: {3g.47gb: 1, 1g.12gb: 4}}
    - {devices: [1], mig-enabled: true, mig-devices: {4g.47gb: 1, 1c.3g.47gb: 3}}
""",
        _busy_on_kept_3g,
    ),
    "enable-with-reset": Scenario(
        "a30-node",
        """
version: v1
mig-configs:
  before:
    - {devices: all, mig-enabled: false}
  after:
    - {devices: [0], mig-enabled: true, mig-devices: {1g.6gb: 2, 2g.12gb: 1}}
    - {devices: [1, 2, 3], mig-enabled: false}
""",
        _persistenced,
    ),
    "disable": Scenario(
        "h100-nvl",
        """
version: v1
mig-configs:
  before:
    - {devices: all, mig-enabled: true, mig-devices: {3g.47gb: 2}}
  after:
    - {devices: [0], mig-enabled: false}
    - {devices: [1], mig-enabled: true, mig-devices: {3g.47gb: 2}}
""",
    ),
}


class Resets:
    """The operator's reset tooling: stops the holder daemons, then resets; can be made to fail."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.fail = False

    def __call__(self, gpu: GpuInfo) -> None:
        if self.fail:
            self.fail = False
            raise Busy(f"GPU {gpu.index} reset failed (injected)")
        for holder in self.node.control.describe()["gpus"][gpu.index]["holders"]:
            self.node.control.remove_holder(gpu.index, holder)
        self.node.control.reset_gpu(gpu.index)


def prepared(state_dir: Path, scenario: Scenario) -> tuple[SimNode, Resets]:
    """A node at the scenario's "before" layout, with its setup done."""
    resets: list[Resets] = []
    node = sim_node(state_dir, scenario.preset, reset=lambda gpu: resets[0](gpu))
    resets.append(Resets(node))
    node.service.apply(parse_spec(scenario.config), "before")
    scenario.setup(node)
    return node, resets[0]


def mutation_points(tmp_path: Path, scenario: Scenario) -> list[ProgressEvent]:
    node, _ = prepared(tmp_path / "dry-run", scenario)
    events: list[ProgressEvent] = []
    node.service.apply(parse_spec(scenario.config), "after", progress=events.append)
    assert node.service.check(parse_spec(scenario.config), "after").applied
    node.close()
    return events


def assert_old_layout(
    node: SimNode, old: dict[str, object], scenario: Scenario, where: str
) -> None:
    assert node.states() == old, f"{where}: layout differs from the one before the apply"
    check = node.service.check(parse_spec(scenario.config), "before")
    assert check.applied, f"{where}: {check.mismatches}"
    assert not node.store.journal_entries(SCOPE), f"{where}: journal left behind"


@pytest.mark.parametrize("name", SCENARIOS)
def test_an_nvml_error_at_any_mutation_rolls_back_to_the_old_layout(
    name: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    scenario = SCENARIOS[name]
    points = [e for e in mutation_points(tmp_path, scenario) if e.phase == "apply"]
    seen: dict[str, int] = {}
    for i, point in enumerate(points, start=1):
        seen[point.action] = seen.get(point.action, 0) + 1
        node, resets = prepared(tmp_path / f"error-{i}", scenario)
        old = node.states()
        if point.action == "reset":
            resets.fail = True
        else:
            function, error = FAULTS[point.action]
            node.control.inject_fault(function, error, nth=seen[point.action])
        with pytest.raises(AgentError) as info:
            node.service.apply(parse_spec(scenario.config), "after")
        assert "rolled back" in str(info.value), f"point {i} ({point.message}): {info.value}"
        assert_old_layout(node, old, scenario, f"error at point {i} ({point.message})")
        node.close()
    print(f"\n{name}: {len(points)} NVML mutation points failed, all rolled back")
    record_property("error_points", len(points))
    assert len(points) >= 5


KILLER = """
import os, signal, sys
from pathlib import Path
from tests.integration.test_mig_faults import SCENARIOS, Resets
from tests.unit.mig.simnode import sim_node
from agent.mig.spec import parse_spec

state_dir, name, kill_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
scenario = SCENARIOS[name]
resets = []
node = sim_node(state_dir, scenario.preset, reset=lambda gpu: resets[0](gpu))
resets.append(Resets(node))
seen = []

def progress(event):
    seen.append(event)
    if len(seen) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

node.service.apply(parse_spec(scenario.config), "after", progress=progress)
sys.exit(3)  # not killed: the point was never reached
"""


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_kill_at_any_mutation_is_recovered_to_the_old_layout(
    name: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    scenario = SCENARIOS[name]
    points = mutation_points(tmp_path, scenario)  # before each mutation, and after each GPU
    disturbed = 0
    for i, point in enumerate(points, start=1):
        state_dir = tmp_path / f"kill-{i}"
        node, _ = prepared(state_dir, scenario)
        old = node.states()
        node.close()
        done = subprocess.run(
            [sys.executable, "-c", KILLER, str(state_dir), name, str(i)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == -signal.SIGKILL, (
            f"point {i}: exit {done.returncode}\n{done.stderr}"
        )
        node = sim_node(state_dir, scenario.preset)  # a new agent starts on the same node
        if not node.service.check(parse_spec(scenario.config), "before").applied:
            disturbed += 1  # the kill left a half-done change behind
        outcomes = node.service.recover()
        assert outcomes and all(o.action in ("rolled-back", "untouched") for o in outcomes), (
            outcomes
        )
        assert_old_layout(
            node, old, scenario, f"kill at point {i} ({point.phase}: {point.message})"
        )
        node.close()
    print(f"\n{name}: {len(points)} kill points recovered ({disturbed} left a half-done change)")
    record_property("kill_points", len(points))
    assert len(points) >= 6
    assert disturbed == len(points) - 1  # all but the kill before the first mutation


def restarted(state_dir: Path, scenario: Scenario) -> SimNode:
    """The node as a new agent opens it, with the operator's reset tooling."""
    resets: list[Resets] = []
    node = sim_node(state_dir, scenario.preset, reset=lambda gpu: resets[0](gpu))
    resets.append(Resets(node))
    return node


TERMINATOR = """
import os, signal, sys
from pathlib import Path
from tests.integration.test_mig_faults import SCENARIOS, Resets
from tests.unit.mig.simnode import sim_node
from tests.unit.mig.suspend import direct_apply
from agent.mig.apply import Suspended
from agent.mig.spec import parse_spec

state_dir, name, term_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
scenario = SCENARIOS[name]
resets = []
node = sim_node(state_dir, scenario.preset, reset=lambda gpu: resets[0](gpu))
resets.append(Resets(node))
seen = []

def progress(event):
    seen.append(event)
    if len(seen) == term_at:
        os.kill(os.getpid(), signal.SIGTERM)

try:
    direct_apply(node.service, parse_spec(scenario.config), "after", force=False,
                 skip_reset=False, progress=progress)
except Suspended as exc:
    sys.exit(exc.exit_code)
sys.exit(0)
"""


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_sigterm_at_any_mutation_is_finished_after_the_restart(
    name: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """docs/mig.md "SIGTERM during an apply": suspended, then rolled forward by the next start,
    across mode changes and GPU resets too."""
    scenario = SCENARIOS[name]
    points = mutation_points(tmp_path, scenario)
    suspended = 0
    for i, point in enumerate(points, start=1):
        state_dir = tmp_path / f"term-{i}"
        node, _ = prepared(state_dir, scenario)
        node.close()
        done = subprocess.run(
            [sys.executable, "-c", TERMINATOR, str(state_dir), name, str(i)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        where = f"SIGTERM at point {i} ({point.phase}: {point.message})"
        assert done.returncode in (0, 143), f"{where}: exit {done.returncode}\n{done.stderr}"
        node = restarted(state_dir, scenario)
        if done.returncode == 143:
            suspended += 1
            outcomes = node.service.recover()
            assert outcomes and {o.action for o in outcomes} == {"completed"}, (where, outcomes)
        check = node.service.check(parse_spec(scenario.config), "after")
        assert check.applied, f"{where}: {check.mismatches}"
        assert not node.store.journal_entries(SCOPE), f"{where}: journal left behind"
        node.close()
    record_property("sigterm_points", len(points))
    assert suspended >= len(points) - 2  # a signal during the last mutation has nothing to stop
