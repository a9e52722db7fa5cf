"""Recovery is correct for any journal history (issue 20).

Random sequences of applies on a simulated node, each maybe hit by injected NVML faults (some
also failing the rollback), a simulated kill or a SIGTERM at a random mutation, an agent restart
or none: whenever the journal is clear again, every GPU holds the layout it had at the last such
point or the target of an apply since, and no GPU instance lacks its compute instances.

A real SIGKILL of a child process over a journal kept from a failed rollback is in
``test_a_sigkill_after_a_failed_rollback_recovers_the_killed_apply``; a journal as older agents
wrote it (two applies in one scope) in ``test_a_two_apply_journal_undoes_both_newest_first``.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.errors import AgentError
from agent.mig.apply import SCOPE, ProgressEvent, Suspended
from agent.mig.node_plan import desired_of
from agent.mig.plan import mismatches
from agent.mig.spec import parse_spec, select_gpus
from agent.mig.state import GpuMigState
from tests.unit.mig.simnode import Killed, SimNode, sim_node

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]

CONFIG = """
version: v1
mig-configs:
  disabled:
    - {devices: all, mig-enabled: false}
  small:
    - {devices: all, mig-enabled: true, mig-devices: {1g.12gb: 7}}
  mixed:
    - {devices: [0], mig-enabled: true, mig-devices: {3g.47gb: 1, 1g.12gb: 4}}
    - {devices: [1], mig-enabled: true, mig-devices: {4g.47gb: 1, 1c.3g.47gb: 3}}
  big:
    - {devices: all, mig-enabled: true, mig-devices: {3g.47gb: 2}}
"""
SPEC = parse_spec(CONFIG)
CONFIGS = ("disabled", "small", "mixed", "big")
FUNCTIONS = (
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
)
ERRORS = {
    "nvmlComputeInstanceDestroy": "InUse",
    "nvmlGpuInstanceDestroy": "InUse",
    "nvmlDeviceSetMigMode": "Unknown",
    "nvmlDeviceCreateGpuInstanceWithPlacement": "InsufficientResources",
    "nvmlGpuInstanceCreateComputeInstance": "InsufficientResources",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement": "InsufficientResources",
}


faults = st.one_of(
    st.none(),
    # count > 1 often fails the rollback too (it calls the same functions)
    st.tuples(st.sampled_from(FUNCTIONS), st.integers(1, 8), st.integers(1, 4)),
)
interruptions = st.one_of(
    st.none(), st.tuples(st.sampled_from(["kill", "sigterm"]), st.integers(1, 30))
)
operations = st.tuples(
    st.sampled_from(CONFIGS),
    faults,
    interruptions,
    st.booleans(),  # restart (recover) before this apply
    st.booleans(),  # leave an unspent fault armed for what comes next
)


def targets(node: SimNode, config: str) -> dict[str, object]:
    _, entries = SPEC.select(config)
    return {s.gpu.uuid: desired_of(s.entry) for s in select_gpus(entries, node.driver.gpus())}


def check_consistent(
    node: SimNode, stable: dict[str, GpuMigState], wanted: list[str], where: str
) -> None:
    for gpu in node.driver.gpus():
        layout = node.driver.layout(gpu.uuid)
        for gi in layout.instances:
            assert gi.compute_instances, f"{where}: GPU {gpu.index} GI {gi.id} has no CI"
        state = node.states()[gpu.uuid]
        at_target = any(
            not mismatches(layout, targets(node, c)[gpu.uuid])  # type: ignore[arg-type]
            for c in wanted
        )
        assert state == stable[gpu.uuid] or at_target, (
            f"{where}: GPU {gpu.index} is neither at its previous layout nor at a target of "
            f"{wanted}: {state}"
        )


def interrupter(interruption: object) -> Callable[[ProgressEvent], None]:
    """A progress callback that kills (or SIGTERMs) the apply at its Nth event."""
    seen: list[ProgressEvent] = []

    def progress(e: ProgressEvent) -> None:
        seen.append(e)
        if interruption is None or len(seen) != interruption[1]:  # type: ignore[index]
            return
        if interruption[0] == "kill":  # type: ignore[index]
            raise Killed
        if e.phase == "apply":
            raise Suspended("SIGTERM")

    return progress


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CONFIGS), st.lists(operations, min_size=1, max_size=6))
def test_any_history_of_applies_faults_and_kills_ends_at_old_or_new_layout(
    start: str, history: list[tuple[str, object, object, bool, bool]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = sim_node(Path(tmp), "h100-nvl")
        try:
            node.service.apply(SPEC, start)
            stable = node.states()
            wanted: list[str] = []
            for i, (config, fault, interruption, restart, keep_fault) in enumerate(history):
                where = f"op {i} ({config}, fault {fault}, {interruption})"
                if restart:
                    node.service.recover()
                if fault is not None:
                    function, nth, count = fault  # type: ignore[misc]
                    node.control.inject_fault(function, ERRORS[function], nth=nth, count=count)
                wanted.append(config)
                try:
                    node.service.apply(SPEC, config, progress=interrupter(interruption))
                    event("applied")
                except Killed:
                    event("killed")
                except Suspended:
                    event("suspended")
                except AgentError as exc:
                    event("failed: rolled back" if "rolled back" in str(exc) else "failed")
                if not keep_fault:
                    node.control.clear_faults()
                if not node.store.journal_entries(SCOPE):
                    check_consistent(node, stable, wanted, where)
                    stable, wanted = node.states(), []
                else:
                    event("journal kept")
            node.control.clear_faults()
            node.service.recover()  # the agent starts once more, on a healthy driver
            assert not node.store.journal_entries(SCOPE), "journal left after recovery"
            check_consistent(node, stable, wanted, "at the end")
        finally:
            node.close()


def _fail_with_failed_rollback(node: SimNode) -> None:
    """An apply to "mixed" whose create-ci fails, and whose rollback fails the same way."""
    node.control.inject_fault(
        "nvmlGpuInstanceCreateComputeInstance", "InsufficientResources", nth=2, count=1
    )
    # the rollback recreates the CIs it destroyed at their placements
    node.control.inject_fault(
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "InsufficientResources", nth=1
    )
    with pytest.raises(AgentError, match="rolling back also failed"):
        node.service.apply(SPEC, "mixed")
    assert node.store.journal_entries(SCOPE)


KILLER = """
import os, signal, sys
from pathlib import Path
from tests.integration.test_mig_recovery_properties import SPEC
from tests.unit.mig.simnode import sim_node

node = sim_node(Path(sys.argv[1]), "h100-nvl")
kill_at = int(sys.argv[2])
seen = []

def progress(event):
    seen.append(event)
    if len(seen) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

node.service.apply(SPEC, "small", progress=progress, operation="second apply")
sys.exit(3)
"""


def test_a_sigkill_after_a_failed_rollback_recovers_the_killed_apply(tmp_path: Path) -> None:
    """Issue 20: the journal of a failed rollback, then a SIGKILL in the next apply. The next
    apply first finishes the old rollback, and recovery undoes the killed apply, naming it."""
    node = sim_node(tmp_path, "h100-nvl")
    node.service.apply(SPEC, "big")
    old = node.states()
    _fail_with_failed_rollback(node)
    node.control.clear_faults()
    node.close()
    done = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp_path), "5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    node = sim_node(tmp_path, "h100-nvl")
    try:
        outcomes = node.service.recover()
        assert outcomes and {o.action for o in outcomes} == {"rolled-back"}, outcomes
        assert all("second apply" in o.detail for o in outcomes), outcomes
        assert node.states() == old
        assert not node.store.journal_entries(SCOPE)
    finally:
        node.close()


def test_an_apply_over_an_unrecoverable_journal_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    node = sim_node(tmp_path, "h100-nvl")
    try:
        node.service.apply(SPEC, "big")
        _fail_with_failed_rollback(node)

        # The rollback keeps failing: the next apply must not begin over it.
        node.control.inject_fault(
            "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "InsufficientResources", nth=1
        )
        with pytest.raises(AgentError, match="could not be rolled back yet"):
            node.service.apply(SPEC, "small")
        node.control.clear_faults()
        assert [e["event"] for _, e in node.store.journal_entries(SCOPE)].count("begin") == 1
        node.service.apply(SPEC, "small")
        assert node.service.check(SPEC, "small").applied
        assert not node.store.journal_entries(SCOPE)
    finally:
        node.close()


def test_a_two_apply_journal_undoes_both_newest_first(tmp_path: Path) -> None:
    """A journal as agents before issue 20 could leave: apply A's rollback failed, then apply B
    began over it and was killed after its first GPU. Recovery must undo B, then A, ending at the
    layout before A, and must not call A "finished" from B's ``done`` entries."""
    node = sim_node(tmp_path, "h100-nvl")
    try:
        node.service.apply(SPEC, "big")
        before_a = node.states()
        _fail_with_failed_rollback(node)
        node.control.clear_faults()
        a_entries = [e for _, e in node.store.journal_entries(SCOPE)]
        node.store.journal_clear(SCOPE)  # what the old agent did not do; B starts over A's mess
        seen: list[ProgressEvent] = []

        def kill_after_first_gpu(e: ProgressEvent) -> None:
            seen.append(e)
            if e.phase == "done":
                raise Killed

        with pytest.raises(Killed):
            node.service.apply(SPEC, "mixed", progress=kill_after_first_gpu)
        b_entries = [e for _, e in node.store.journal_entries(SCOPE)]
        node.store.journal_clear(SCOPE)
        for entry in a_entries + b_entries:
            node.store.journal_append(SCOPE, entry)
        outcomes = node.service.recover()
        assert all(o.action in ("rolled-back", "untouched") for o in outcomes), outcomes
        assert node.states() == before_a
        for gpu in node.driver.gpus():
            assert all(gi.compute_instances for gi in node.driver.layout(gpu.uuid).instances)
        assert not node.store.journal_entries(SCOPE)
    finally:
        node.close()


def test_a_rolled_back_apply_logs_one_line_saying_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = sim_node(tmp_path, "h100-nvl")
    try:
        node.control.inject_fault(
            "nvmlDeviceCreateGpuInstanceWithPlacement", "InsufficientResources", nth=2
        )
        with (
            caplog.at_level(logging.WARNING, logger="agent.mig.service"),
            pytest.raises(AgentError, match="Insufficient Resources; rolled back GPU 0"),
        ):
            node.service.apply(SPEC, "small")
        (line,) = [r.getMessage() for r in caplog.records if r.name == "agent.mig.service"]
        assert line.count("rolled back") == 1, line
        assert "Insufficient Resources" in line  # the driver's text, not "code 23"
    finally:
        node.close()
