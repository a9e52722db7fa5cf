"""``gpu-agent operations``: the agent's long work, found again after the command that started
it is gone (list, show, wait, cancel), on a simulated node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.cli.operations import operations
from agent.gpu.sim import SimControl

Invoke = Callable[..., Result]

CONFIG = """
version: v1
mig-configs:
  balanced:
    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}}
"""


@pytest.fixture
def run(tmp_path: Path) -> Invoke:
    """``run(group, *args)``: one command of ``group`` on a simulated dgx-a100 in ``tmp_path``."""
    (tmp_path / "mig.yaml").write_text(CONFIG)

    def invoke(group: click.Group, *args: str) -> Result:
        env = {"GPU_AGENT_SIMULATE_LATENCY": "false"}
        obj = CliContext(None, {"simulate": "dgx-a100", "state_dir": tmp_path}, env=env)
        try:
            return CliRunner().invoke(group, list(args), obj=obj)
        finally:
            obj.close()

    return invoke


def test_a_failed_apply_is_listed_shown_and_waited_for_with_its_exit_code(
    run: Invoke, tmp_path: Path
) -> None:
    """A `mig apply` that failed (or that Ctrl-C detached from) could be seen again only through
    the OperationsService RPCs: no command listed the agent's operations or waited for one.
    `operations list --all` shows it failed with its error, `show` says the same, and `wait`
    exits with the error's exit code (Conflict: 4), as the apply itself did."""
    assert run(operations, "list", "--all").output.strip() == "no operation"
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceCreateGpuInstanceWithPlacement", "InsufficientResources", nth=2
    )
    applied = run(mig, "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "balanced")
    assert applied.exit_code == 4, applied.output

    listed = run(operations, "list", "--all", "--kind", "mig.apply", "-o", "json")
    assert listed.exit_code == 0, listed.output
    (op,) = json.loads(listed.output)
    assert op["state"] == "failed" and op["done"] is True
    assert (
        op["error"]["reason"] == "Conflict" and "Insufficient Resources" in op["error"]["message"]
    )
    assert run(operations, "list").output.strip() == "no operation"  # none running

    bare_id = op["name"].removeprefix("operations/")
    shown = run(operations, "show", bare_id)
    assert shown.exit_code == 0 and "State:     failed" in shown.output, shown.output
    waited = run(operations, "wait", op["name"], "-o", "json")
    assert waited.exit_code == 4, waited.output
    assert "Insufficient Resources" in waited.output


def test_an_operation_the_agent_never_had_is_not_found(run: Invoke) -> None:
    """A well-formed name the agent does not know exits 3 (NotFound); a malformed one 2."""
    unknown = run(operations, "wait", "0123456789abcdef0123456789abcdef")
    assert unknown.exit_code == 3, unknown.output
    assert "does not exist" in unknown.output
    malformed = run(operations, "show", "../etc")
    assert malformed.exit_code == 2, malformed.output


def test_an_apply_with_nothing_to_change_reads_done_not_pending(
    run: Invoke, tmp_path: Path
) -> None:
    """An apply that found every GPU as asked succeeded with its progress left at "pending:
    0/0 GPUs": `operations list` showed it succeeded and pending at once."""
    config = str(tmp_path / "mig.yaml")
    assert run(mig, "apply", "-f", config, "-c", "balanced").exit_code == 0
    again = run(mig, "apply", "-f", config, "-c", "balanced")
    assert again.exit_code == 0, again.output
    listed = json.loads(run(operations, "list", "--all", "-o", "json").output)
    assert [op["state"] for op in listed] == ["succeeded", "succeeded"]
    assert [op["progress"].split(":")[0] for op in listed] == ["done", "done"], listed
