"""``gpu-agent mig`` on a simulated node: mig-parted's messages and exit codes."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.gpu.types import Placement
from agent.mig.lock import PartitionLock
from agent.mig.state import fetch

CONFIG = """
version: v1
mig-configs:
  balanced:
    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}}
  three-plus-four:
    - {devices: all, mig-enabled: true, mig-devices: {3g.20gb: 1, 1g.5gb: 4}}
  too-big:
    - {devices: all, mig-enabled: true, mig-devices: {4g.20gb: 1, 2g.10gb: 2}}
  h100-names:
    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb+me: 1}}
"""


Invoke = Callable[..., Result]


def _invoker(tmp_path: Path, preset: str) -> Invoke:
    """Runs ``gpu-agent --simulate PRESET --state-dir TMP mig ARGS``; FILE is the config above.

    The environment is empty but for the latency model turned off (these tests are about what
    the commands say and do, not how long a reconfiguration takes; with it on, each apply on
    the 8-GPU node slept ~14 s)."""
    config = tmp_path / "mig.yaml"
    if not config.exists():
        config.write_text(CONFIG)

    def invoke(*args: str, stdin: str | bytes | None = None) -> Result:
        env = {"GPU_AGENT_SIMULATE_LATENCY": "false"}
        obj = CliContext(None, {"simulate": preset, "state_dir": tmp_path}, env=env)
        try:
            argv = [a.replace("FILE", str(config)) for a in args]
            return CliRunner().invoke(mig, argv, obj=obj, input=stdin)
        finally:
            obj.close()

    return invoke


@pytest.fixture
def a30(tmp_path: Path) -> Invoke:
    return _invoker(tmp_path, "a30-node")


@pytest.fixture
def a100(tmp_path: Path) -> Invoke:
    return _invoker(tmp_path, "dgx-a100")


def test_apply_then_assert_speak_mig_parted(a100: Invoke) -> None:
    applied = a100("apply", "-f", "FILE", "-c", "balanced")
    assert applied.exit_code == 0, applied.output
    assert "MIG configuration applied successfully" in applied.output
    ok = a100("assert", "-f", "FILE", "-c", "balanced")
    assert ok.exit_code == 0 and "Selected MIG configuration currently applied" in ok.output
    bad = a100("assert", "-f", "FILE", "-c", "three-plus-four")
    assert bad.exit_code == 1
    assert "Assertion failure: selected configuration not currently applied" in bad.output
    assert "want 1g.5gb: 4, 3g.20gb: 1" in bad.output


def test_apply_and_assert_read_a_config_from_a_pipe(a100: Invoke) -> None:
    """`mig apply -f <(kubectl get cm ...)` and `mig assert` on such a pipe parsed the config,
    then read the file a second time for the agent: a pipe's second read is empty, so they
    failed with "the MIG config is missing or malformed" (exit 2) for a good config, while
    `mig plan` worked. The text checked is now the text sent."""

    opened: list[int] = []

    def pipe() -> str:
        read, write = os.pipe()
        os.write(write, CONFIG.encode())
        os.close(write)
        opened.append(read)
        return f"/dev/fd/{read}"

    try:
        applied = a100("apply", "-f", pipe(), "-c", "balanced")
        assert applied.exit_code == 0, applied.output
        assert "MIG configuration applied successfully" in applied.output
        held = a100("assert", "-f", pipe(), "-c", "balanced")
        assert held.exit_code == 0 and "currently applied" in held.output, held.output
    finally:
        for fd in opened:
            os.close(fd)


def test_a_checkpoint_that_cannot_be_written_names_its_option(a100: Invoke, tmp_path: Path) -> None:
    """`mig checkpoint -f DIR` was refused naming `output-file`, an option checkpoint does not
    have (it is generate-config's); the user's option is -f/--checkpoint-file."""
    refused = a100("checkpoint", "-f", str(tmp_path))
    assert refused.exit_code == 2, refused.output
    assert "checkpoint-file: a writable path" in refused.output
    assert "output-file" not in refused.output


def test_an_apply_that_selects_no_gpu_of_the_node_says_so(
    a100: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config whose device filter is another model's (an H100 config on this A100 node) said
    only "MIG configuration applied successfully" over an empty table, and `mig assert` of it
    then failed: the apply now warns, with the assert's own lines, that it changed no GPU and
    that assert fails (exit 0 still, as mig-parted's). The apply's result carries those lines:
    the command makes no AssertMig call of its own for them."""
    from agent.client import AgentClient

    asserted: list[object] = []
    original = AgentClient.assert_mig

    def counted(self: AgentClient, *args: Any, **kwargs: Any) -> Any:
        asserted.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AgentClient, "assert_mig", counted)
    other = tmp_path / "h100.yaml"
    other.write_text(
        "version: v1\nmig-configs:\n  h100:\n    - device-filter: ['0x233010DE']\n"
        "      devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 7}\n"
    )
    applied = a100("apply", "-f", str(other), "-c", "h100")
    assert applied.exit_code == 0, applied.output
    assert "warning: GPU 0 is not selected by any entry of h100" in applied.output
    assert "warning: no GPU changed, and `mig assert` of this config fails" in applied.output
    assert asserted == []
    as_json = a100("apply", "-f", str(other), "-c", "h100", "-o", "json")
    unheld = json.loads(as_json.stdout)["assert_mismatches"]
    assert unheld == [f"GPU {i} is not selected by any entry of h100" for i in range(8)]
    assert a100("assert", "-f", str(other), "-c", "h100").exit_code == 1
    quiet = a100("apply", "-f", "FILE", "-c", "balanced")  # a config that holds says nothing
    assert quiet.exit_code == 0 and "warning" not in quiet.output, quiet.output


def test_a_lost_gpu_the_config_selects_is_never_asserted_applied(
    a100: Invoke, tmp_path: Path
) -> None:
    """The lost GPU was left out of the check and the rest matched: "currently applied",
    exit 0, for a GPU nobody could read. A config that leaves it out still asserts."""
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    checkpoint = tmp_path / "checkpoint.json"
    assert a100("checkpoint", "-f", str(checkpoint)).exit_code == 0
    SimControl(tmp_path).mark_lost(3)
    # A checkpoint without GPU 3 would restore the rest and call it exact: nothing is written.
    after = tmp_path / "after.json"
    refused = a100("checkpoint", "-f", str(after))
    assert refused.exit_code == 7 and not after.exists(), refused.output
    assert "GPU 3 lost: its MIG state cannot be read" in refused.output
    # An export said `devices: all` for the seven GPUs read, GPU 3 among "all".
    exported = a100("export")
    assert exported.exit_code == 7 and "devices" not in exported.output, exported.output
    assert "so an export would not describe it" in exported.output
    # A restore names the lost GPU, not "no GPU … on this node" as if it were another node's.
    restore = a100("restore", "-f", str(checkpoint))
    assert restore.exit_code == 2, restore.output
    assert "GPU 3 is lost and its UUID cannot be read: it may be this one" in restore.output
    lost = a100("assert", "-f", "FILE", "-c", "balanced")
    assert lost.exit_code == 1, lost.output
    assert "GPU 3 is lost: whether it holds balanced cannot be read" in lost.output
    others = tmp_path / "others.yaml"
    others.write_text(
        "version: v1\nmig-configs:\n  rest:\n    - devices: [0, 1, 2, 4, 5, 6, 7]\n"
        "      mig-enabled: true\n      mig-devices: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}\n"
    )
    assert a100("assert", "-f", str(others), "-c", "rest").exit_code == 0

    # The dry run says so first, and exits as the apply will.
    planned = a100("plan", "-f", "FILE", "-c", "three-plus-four")
    assert planned.exit_code == 1, planned.output
    assert "not planned (lost: an apply fails on it): GPU 3" in planned.output
    assert "7 GPU(s) change" in planned.output
    assert a100("plan", "-f", str(others), "-c", "rest").exit_code == 0

    # An apply reaches the GPUs that answer and says the lost one was not applied (exit 1,
    # as mig-parted's NVML error): it said "applied successfully" without it.
    applied = a100("apply", "-f", "FILE", "-c", "three-plus-four")
    assert applied.exit_code == 1, applied.output
    assert "GPU 3 is lost (" in applied.output and "): not applied" in applied.output
    assert "MIG configuration NOT applied to every GPU: some are lost" in applied.output
    assert "applied successfully" not in applied.output
    rows = {line.split()[0]: line.split()[1] for line in applied.output.splitlines()
            if line[:1].isdigit() and len(line.split()) == 5}  # fmt: skip
    assert rows["3"] == "lost" and rows["0"] == "applied"
    assert a100("apply", "-f", str(others), "-c", "rest").exit_code == 0  # GPU 3 not asked for


@pytest.mark.parametrize(
    ("fault", "call"),
    [
        ("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode"),  # the scan's read
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"),
    ],
)
def test_a_gpu_that_fails_a_read_leaves_mig_to_the_others_and_is_never_said_applied(
    a100: Invoke, tmp_path: Path, fault: str, call: str
) -> None:
    """GPU 3's MIG mode read (or its process list) failing (UNKNOWN, as a GPU that needs a
    reset answers) failed every MIG command, one for GPU 0 alone too, with only the call's
    error (exit 1). The others are reached now; GPU 3 is never "applied", and is named with
    the failing call."""
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    checkpoint = tmp_path / "checkpoint.json"
    assert a100("checkpoint", "-f", str(checkpoint)).exit_code == 0
    SimControl(tmp_path).inject_fault(fault, "Unknown", gpu=3, count=10**6)
    why = f"GPU 3 cannot be read ({call}: Unknown Error)"
    restore = a100("restore", "-f", str(checkpoint))
    assert restore.exit_code == 2, restore.output
    assert "GPU 3 cannot be read (" in restore.output and call in restore.output
    advised = a100("advise", "--gpu", "3")
    assert advised.exit_code != 0 and f"{why}: what fits on it is unknown" in advised.output
    advice = [line for line in a100("advise").output.splitlines() if line.startswith("GPU 3")]
    assert advice and f"cannot be read ({call}: Unknown Error)" in advice[0]
    others = tmp_path / "others.yaml"
    others.write_text(
        "version: v1\nmig-configs:\n  rest:\n    - devices: [0, 1, 2, 4, 5, 6, 7]\n"
        "      mig-enabled: true\n      mig-devices: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}\n"
    )
    assert a100("assert", "-f", str(others), "-c", "rest").exit_code == 0
    assert a100("apply", "-f", str(others), "-c", "rest").exit_code == 0
    held = a100("assert", "-f", "FILE", "-c", "balanced")
    assert held.exit_code == 1, held.output  # it was "currently applied" without GPU 3
    assert f"{why}: whether it holds balanced cannot be read" in held.output
    exported = a100("export")
    assert exported.exit_code != 0 and "devices" not in exported.output, exported.output
    assert f"{why}: its MIG state cannot be read" in exported.output
    planned = a100("plan", "-f", "FILE", "-c", "three-plus-four")
    assert planned.exit_code == 1, planned.output
    assert (
        f"not planned (cannot be read: an apply fails on it): GPU 3 ({call}: Unknown Error)"
        in planned.output
    ), planned.output
    assert "not planned (lost" not in planned.output, planned.output  # it is not lost
    data = json.loads(a100("plan", "-f", "FILE", "-c", "three-plus-four", "-o", "json").stdout)
    assert data["lost_gpus"] == [], data
    assert data["unread_gpus"] == [{"gpu": 3, "unread": f"{call}: Unknown Error"}], data
    applied = a100("apply", "-f", "FILE", "-c", "three-plus-four")
    assert applied.exit_code == 1, applied.output
    assert f"{why}: not applied" in applied.output
    assert "NOT applied to every GPU: some are lost or cannot be read" in applied.output
    rows = {line.split()[0]: line.split()[1] for line in applied.output.splitlines()
            if line[:1].isdigit() and len(line.split()) == 5}  # fmt: skip
    assert rows["3"] == "unread" and rows["0"] == "applied"


def test_assert_is_the_agents_answer_with_mode_only_and_the_lost_and_unread_gpus(
    a100: Invoke, tmp_path: Path
) -> None:
    """`mig assert` asks the node's agent (AssertMig), as the label protocol and the fleet do,
    rather than computing its own verdict: --mode-only and the lost GPUs travel both ways, and
    one that cannot be read is said so, with its call, not as lost (it was in ``lost``)."""
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    # Every GPU has MIG on, with other instances than three-plus-four asks for.
    assert a100("assert", "-m", "-f", "FILE", "-c", "three-plus-four").exit_code == 0
    assert a100("assert", "-f", "FILE", "-c", "three-plus-four").exit_code == 1
    SimControl(tmp_path).mark_lost(3)
    # GPU 5 answers but its reads fail: it cannot be read (with the call), it is not lost.
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=5, count=10**6)
    unread = "GPU 5 cannot be read (nvmlDeviceGetMigMode: Unknown Error)"
    answer = a100("assert", "-o", "json", "-f", "FILE", "-c", "balanced")
    assert answer.exit_code == 1, answer.output
    data = json.loads(answer.stdout)
    assert data["applied"] is False and data["lost"] == [3], data
    assert data["unread"] == [{"gpu": 5, "unread": "nvmlDeviceGetMigMode: Unknown Error"}]
    assert data["mismatches"] == [
        "GPU 3 is lost: whether it holds balanced cannot be read",
        f"{unread}: whether it holds balanced cannot be read",
    ]
    said = a100("assert", "-f", "FILE", "-c", "balanced")
    assert said.exit_code == 1 and f"{unread}: whether it holds" in said.output, said.output
    assert "GPU 5 is lost" not in said.output


def test_plan_shows_kept_destroyed_created_and_the_comparison(a100: Invoke) -> None:
    a100("apply", "-f", "FILE", "-c", "balanced")
    planned = a100("plan", "-f", "FILE", "-c", "three-plus-four")
    assert planned.exit_code == 0, planned.output
    assert "8 GPU(s) change: 24 instance(s) kept, 8 destroyed, 16 created" in planned.output
    assert "(mig-parted would destroy 32)" in planned.output
    data = yaml.safe_load(a100("plan", "-f", "FILE", "-c", "three-plus-four", "-o", "yaml").output)
    assert data["gpus"][0]["destroy"] == ["2g.10gb@0:2"]
    assert data["summary"]["mig_parted_would_destroy"] == 32


def test_plan_exits_4_and_explains_a_layout_that_cannot_fit(a100: Invoke) -> None:
    planned = a100("plan", "-f", "FILE", "-c", "too-big")
    assert planned.exit_code == 4
    assert "2g.10gb does not fit next to 4g.20gb@0:4" in planned.output
    assert "fits instead: 2g.10gb: 1, 4g.20gb: 1" in planned.output


def test_a_name_from_another_board_exits_2_naming_this_boards_profiles(a30: Invoke) -> None:
    result = a30("apply", "-f", "FILE", "-c", "h100-names")
    assert result.exit_code == 2
    assert "its profiles are: 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb" in result.output


def test_show_draws_the_slice_map(a30: Invoke) -> None:
    spec = (
        "version: v1\nmig-configs: {x: [{devices: all, mig-enabled: true, "
        "mig-devices: {2g.12gb: 1}}]}"
    )
    assert a30("apply", "-f", "-", stdin=spec).exit_code == 0
    shown = a30("show")
    assert "slice     0          1          2          3" in shown.output
    assert "│       2g.12gb       │   free   │   free   │" in shown.output
    data = yaml.safe_load(a30("show", "-o", "yaml").output)
    assert data[0]["slices"] == [data[0]["instances"][0]["gpu_instance_id"]] * 2 + [None, None]


def test_export_round_trips_through_apply(a100: Invoke, tmp_path: Path) -> None:
    a100("apply", "-f", "FILE", "-c", "three-plus-four")
    exported = a100("export", "-l", "golden")
    assert yaml.safe_load(exported.output)["mig-configs"]["golden"][0]["mig-devices"] == {
        "1g.5gb": 4,
        "3g.20gb": 1,
    }
    (tmp_path / "mig.yaml").write_text(exported.output)
    assert a100("assert", "-f", "FILE").exit_code == 0  # a single config needs no -c
    # A label the config cannot carry is refused under the flag's name, not the API's field.
    refused = a100("export", "-l", "gol\tden")
    assert refused.exit_code == 2 and "config-label: at most 253 printable" in refused.output
    assert "config_name" not in refused.output


def test_a_second_apply_is_refused_with_exit_5(a100: Invoke, tmp_path: Path) -> None:
    with PartitionLock(tmp_path).hold("mig apply x (operation 7)"):
        result = a100("apply", "-f", "FILE", "-c", "balanced")
    assert result.exit_code == 5
    assert (
        "another reconfiguration is running on this node: mig apply x (operation 7)"
        in result.output
    )


def test_valid_config_only_parses(a30: Invoke) -> None:
    assert a30("assert", "-f", "FILE", "-c", "balanced", "-a").output.strip() == (
        "Selected MIG configuration is valid"
    )
    missing = a30("assert", "-f", "FILE", "-c", "nope", "-a")
    assert missing.exit_code == 2 and "selected mig-config not present: nope" in missing.output


def test_identical_gpus_are_planned_and_shown_once(a100: Invoke) -> None:
    """Issue 20: an 8-GPU plan was 171 lines of identical blocks."""
    planned = a100("plan", "-f", "FILE", "-c", "balanced")
    assert planned.exit_code == 0, planned.output
    assert "GPU 0-7  NVIDIA A100-SXM4-40GB (mig-configs.balanced[0]): CHANGE" in planned.output
    assert planned.output.count("steps:") == 1
    assert "8 GPU(s) change: 0 instance(s) kept, 0 destroyed, 32 created" in planned.output
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    shown = a100("show").output
    assert shown.startswith("GPU 0-7  NVIDIA A100-SXM4-40GB  MIG enabled\n"), shown
    assert shown.count("slice     0") == 1
    assert len(yaml.safe_load(a100("show", "-o", "yaml").output)) == 8  # data stays per GPU


def test_gpus_that_differ_are_shown_apart_with_their_uuid(a30: Invoke, tmp_path: Path) -> None:
    spec = (
        "version: v1\nmig-configs: {x: [{devices: [0], mig-enabled: true, "
        "mig-devices: {2g.12gb: 1}}, {devices: [1, 2, 3], mig-enabled: false}]}"
    )
    assert a30("apply", "-f", "-", stdin=spec).exit_code == 0
    shown = a30("show").output
    titles = [line for line in shown.splitlines() if line.startswith("GPU ")]
    assert len(titles) == 2 and titles[0].startswith("GPU 0  NVIDIA A30  GPU-"), titles
    assert titles[1] == "GPU 1-3  NVIDIA A30  MIG disabled"


def test_an_invalid_config_prints_each_problem_once(a100: Invoke) -> None:
    bad = (
        "version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: true, "
        "mig-devices: {bogus: 1}}\n    - {devices: all, mig-enabled: true}\n"
    )
    result = a100("apply", "-f", "-", stdin=bad)
    assert result.exit_code == 2
    assert result.output.count("invalid MIG profile 'bogus'") == 1, result.output
    assert result.output.count("missing required field 'mig-devices'") == 1, result.output


def test_progress_is_one_line_per_step(a100: Invoke) -> None:
    result = a100("apply", "-f", "FILE", "-c", "balanced")
    lines = [line for line in result.stderr.splitlines() if line]
    assert len(lines) == len(set(lines)), lines
    assert [line for line in lines if line.endswith(" done")] == [f"GPU {i} done" for i in range(8)]


def test_a_gpu_done_is_said_even_when_the_watch_missed_its_update(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Progress is a state, read when the watcher wakes: under load GPU 1's forced "done"
    update was overwritten by GPU 2's before it was read, and its line never came (the flake
    of test_progress_is_one_line_per_step). Each update lists the GPUs done so far."""
    from agent.cli.mig import _follow
    from agent.wire.operations import MigProgress, OperationView

    def view(meta: MigProgress, done: bool = False) -> OperationView:
        return OperationView(
            "operations/x", "mig.apply", "running", done, None, (), meta, None, None, (), "", ""
        )

    seen = [
        view(MigProgress("c", "apply", 1, "GPU 0: create 1g", 3, 0, 6, ())),
        view(MigProgress("c", "done", 2, "GPU 0 done", 3, 1, 6, (0,))),
        # GPU 1's "done" and GPU 2's steps were not read
        view(MigProgress("c", "done", 6, "GPU 2 done", 3, 3, 6, (0, 1, 2)), done=True),
    ]

    class Client:
        def follow(self, op: object, progress: Callable[[OperationView], None]) -> OperationView:
            for update in seen:
                progress(update)
                progress(update)  # updates repeat
            return seen[-1]

    _follow(Client(), seen[0], embedded=False)  # type: ignore[arg-type]
    lines = capsys.readouterr().err.splitlines()[1:]
    assert lines == ["[1] apply: GPU 0: create 1g", "GPU 0 done", "GPU 1 done", "GPU 2 done"]


def _place(state_dir: Path, preset: str, gpu: int, instances: list[tuple[str, int]]) -> None:
    """Make instances at exact placements on the simulated driver, as a DRA driver would."""
    driver = open_driver(preset, state_dir)
    try:
        uuid = driver.gpus()[gpu].uuid
        driver.set_mig_mode(uuid, True)
        by_name = {p.name: p for p in driver.gi_profiles(uuid)}
        for name, start in instances:
            profile = by_name[name]
            gi = driver.create_gpu_instance(
                uuid, profile.id, Placement(start, profile.memory_slices)
            )
            full = max(driver.ci_profiles(uuid, gi.id), key=lambda c: c.slice_count)
            driver.create_compute_instance(uuid, gi.id, full.id)
    finally:
        driver.close()


def _states(state_dir: Path) -> list[object]:
    driver = open_driver("dgx-a100", state_dir)
    try:
        return [fetch(driver.layout(g.uuid)) for g in driver.gpus()]
    finally:
        driver.close()


def test_advise_names_the_placement_to_use_and_the_moves_that_fit_a_fragmented_profile(
    a100: Invoke, tmp_path: Path
) -> None:
    _place(tmp_path, "dgx-a100", 0, [("1g.5gb", 2), ("1g.5gb", 5)])
    before = _states(tmp_path)
    table = a100("advise", "--gpu", "0")
    assert table.exit_code == 0, table.output
    assert "GPU 0 (NVIDIA A100-SXM4-40GB): memory slices 6 of 8 free (0,1,3,4,6,7)" in table.output
    assert (
        "3g.20gb: fragmented: 6 free memory slice(s) and 5 free compute slice(s) are enough, "
        "but no placement is free" in table.output
    )
    assert "it would fit at slice 4 if the 1g.5gb at slice 5 were at slice 3" in table.output
    data = json.loads(a100("advise", "--gpu", "0", "--profile", "2g.10gb", "-o", "json").output)
    (gpu,) = data
    (two,) = gpu["profiles"]
    assert [o["start"] for o in two["placements"]] == [0]
    assert two["recommended"] == 0 and two["placements"][0]["largest_after"] == "1g.10gb"
    assert gpu["fits_now"]["3g.20gb"] == 0 and gpu["fits_now"]["1g.5gb"] == 5
    # Read only: the layout is as it was.
    assert _states(tmp_path) == before


def test_advise_refuses_a_gpu_or_profile_the_node_lacks(a100: Invoke, tmp_path: Path) -> None:
    assert a100("advise", "--gpu", "9").exit_code == 2
    bad = a100("advise", "--profile", "9g.1gb")
    assert bad.exit_code == 2
    assert "they offer:" in str(bad.exception) + bad.output
    # A lost GPU is on the node: it said "no GPU with index 3 on this node".
    SimControl(tmp_path).mark_lost(3)
    lost = a100("advise", "--gpu", "3")
    assert lost.exit_code == 7, lost.output
    assert "GPU 3 is lost: what fits on it cannot be read" in lost.output
    assert "no GPU with index 3" not in lost.output


def test_advise_for_every_gpu_names_a_lost_one_rather_than_leave_it_out(
    a100: Invoke, tmp_path: Path
) -> None:
    # It printed seven GPUs and exited 0, as if the node had seven: nothing said GPU 3 was lost.
    assert a100("advise").exit_code == 0  # makes the simulated node
    SimControl(tmp_path).mark_lost(3)
    table = a100("advise")
    assert table.exit_code == 0, table.output
    assert "GPU 3" in table.stdout and "lost" in table.stdout, table.stdout
    data = json.loads(a100("advise", "-o", "json").stdout)
    assert [g["gpu"] for g in data] == list(range(8))
    (lost,) = [g for g in data if g["gpu"] == 3]
    assert "lost" in lost["note"] and lost["profiles"] == [] and lost["fits_now"] == {}


def test_a_checkpoint_no_driver_could_hold_is_refused_before_any_change(
    a100: Invoke, tmp_path: Path
) -> None:
    """MigMode 0 with GPU instances destroyed GPU 0's instances, turned MIG off and then failed
    (exit 6); a placement the profile has not, or past 2**32, was tried on the driver; deep
    nesting was a RecursionError traceback. Each is refused now naming the field, nothing
    changed."""
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    saved = tmp_path / "cp.json"
    assert a100("checkpoint", "-f", str(saved)).exit_code == 0
    before = _states(tmp_path)
    good = json.loads(saved.read_text())

    def variant(change: Callable[[dict[str, object]], None]) -> str:
        doc = json.loads(json.dumps(good))
        change(doc["MigState"]["Devices"][0])
        return json.dumps(doc)

    def gi0(d: dict[str, object]) -> dict[str, object]:
        return d["GpuInstances"][0]  # type: ignore[index,no-any-return]

    cases = {
        "GpuInstances": variant(lambda d: d.update(MigMode=0)),
        "has no placement 1:2": variant(lambda d: gi0(d).update(Placement={"Start": 1, "Size": 2})),
        "Placement.Start": variant(lambda d: gi0(d).update(Placement={"Start": 2**70, "Size": 2})),
        "ProfileID": variant(lambda d: gi0(d).update(ProfileID=True)),
        "MigMode": variant(lambda d: d.update(MigMode="1")),
        "nested too deeply": "[" * 100_000 + "]" * 100_000,
    }
    for field, text in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        refused = a100("restore", "-f", str(bad))
        assert refused.exit_code == 2, (field, refused.output)
        assert field in refused.output, (field, refused.output)
        assert refused.exception is None or isinstance(refused.exception, SystemExit), field
        assert _states(tmp_path) == before, field


def test_restore_of_an_endless_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    """`mig restore -f /dev/zero` (or any file far past the checkpoint limit) read the whole
    file before the size check: a MemoryError traceback, exit 1, after filling the memory. The
    file is now read one byte past the limit and refused naming the option (exit 2)."""

    def one_gib_of_address_space() -> None:  # the old read fails within it, fast
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    argv = ["--simulate", "dgx-a100", "--state-dir", str(tmp_path), "mig", "restore"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_AGENT_", "MIG_PARTED"))}
    refused = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *argv, "-f", "/dev/zero"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=one_gib_of_address_space,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert "checkpoint-file: at most" in refused.stderr and "Traceback" not in refused.stderr


def test_a_config_on_stdin_that_is_not_utf8_is_refused_naming_the_option(a100: Invoke) -> None:
    """`mig plan -f -` of bytes that are not UTF-8 was a UnicodeEncodeError traceback."""
    for command in ("plan", "apply", "assert"):
        refused = a100(command, "-f", "-", "-c", "a", stdin=b"\x8a\x00\xff")
        assert refused.exit_code == 2, (command, refused.output)
        assert "not UTF-8" in refused.output and "config-file" in refused.output, refused.output


def test_a_lost_gpu_is_named_beside_a_pending_mode_change(a100: Invoke, tmp_path: Path) -> None:
    """With one GPU's mode change pending and another GPU lost, the verdict named only the
    pending one: a reset looked like all it took. Both are said; pending's exit 14 stays."""
    assert a100("apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    disabled = tmp_path / "off.yaml"
    disabled.write_text(
        "version: v1\nmig-configs:\n  disabled:\n    - {devices: all, mig-enabled: false}\n"
    )
    control = SimControl(tmp_path)
    control.add_holder(1, "dcgm")
    control.mark_lost(2)
    result = a100("apply", "-f", str(disabled), "-c", "disabled", "--skip-reset")
    assert result.exit_code == 14, result.output
    assert "GPU 1: MIG mode change pending" in result.stdout, result.stdout
    assert "GPU 2 is lost" in result.stdout and "not applied" in result.stdout, result.stdout


def test_an_output_file_under_a_relative_dev_folder_is_replaced_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev and /proc files are written as they are (/dev/stdout, a pipe); the test took any
    path whose second part is `dev`, so `out/dev/checkpoint.json` was truncated and written in
    place, the cut-short write the temp file and rename exist to prevent."""
    from agent.cli.options import write_output

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out" / "dev" / "checkpoint.json"
    target.parent.mkdir(parents=True)
    target.write_text("previous")
    before = target.stat().st_ino
    write_output(Path("out/dev/checkpoint.json"), "new", "checkpoint-file")
    assert target.read_text() == "new"
    assert target.stat().st_ino != before  # a new file renamed over it, not the old one cut


def test_plan_is_the_agents_answer_not_one_made_in_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mig plan` asked PlanMig only whether it refused, then planned the GetNode snapshot
    itself: what it drew was not what the agent, reading the GPUs live, would apply. It draws
    the agent's answer (here one no snapshot holds) and asks nothing else."""
    from agent.wire.mig import MigPlanView, PlanBlocker, PlannedGpu

    busy = PlannedGpu(
        gpu_index=0,
        gpu_uuid="GPU-0",
        status="blocked",
        steps=("destroy GPU instance 2 (3g.20gb@4:4)",),
        blockers=(PlanBlocker(4242, "3g.20gb@4:4", "destroy"),),
        infeasible_reason="",
        keep=(),
        destroy=("3g.20gb@4:4",),
        create=(),
        deferred=False,
        entry="mig-configs.balanced[0]",
        gpu_name="NVIDIA A100-SXM4-40GB",
        destroy_ids=(2,),
        mig_parted_would_destroy=1,
    )
    asked: list[tuple[str, str, bool]] = []

    class Agent:
        def plan_mig(self, text: str, name: str = "", force: bool = False) -> MigPlanView:
            asked.append((text, name, force))
            return MigPlanView("balanced", (busy,), unselected_gpus=(1,), skipped_gpus=())

    monkeypatch.setattr(CliContext, "agent", lambda self: Agent())
    planned = _invoker(tmp_path, "dgx-a100")("plan", "-f", "FILE", "-c", "balanced", "--force")
    assert planned.exit_code == 5, planned.output
    assert asked == [(CONFIG, "balanced", True)]
    assert "GPU 0  NVIDIA A100-SXM4-40GB (mig-configs.balanced[0]): BLOCKED" in planned.output
    assert "destroy  3g.20gb@4:4 (GI 2)" in planned.output
    assert "BLOCKED  process 4242 on 3g.20gb@4:4 blocks destroy" in planned.output
    assert "not selected by any entry: GPU 1" in planned.output
    assert "0 GPU(s) change" not in planned.output and "(mig-parted would destroy 1)" in (
        planned.output
    )


def test_plan_shows_a_mode_change_pending_and_exits_as_the_apply_when_a_reboot_applies_it(
    a30: Invoke, tmp_path: Path
) -> None:
    """A GPU whose MIG mode waits for a reset or (a passthrough VM) a reboot was planned as if
    settled: the plan now says it is pending and what applies it (PlanMig's mode_pending), and
    exits 14 as the apply does when the mode it changes can only wait for a VM reboot."""
    open_driver("a30-node", tmp_path).close()  # the node's state file exists from here on
    SimControl(tmp_path).set_passthrough_vm(True)
    halves = (
        "version: v1\nmig-configs:\n  halves:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"2g.12gb": 2}\n'
    )
    (tmp_path / "mig.yaml").write_text(halves)
    assert a30("apply", "-f", "FILE", "-c", "halves").exit_code == 14
    planned = a30("plan", "-f", "FILE", "-c", "halves")
    assert planned.exit_code == 14, planned.output
    assert "MIG mode change pending: a reboot of this (passthrough) VM applies it" in (
        planned.output
    )
    assert "stays pending until this VM reboots" in planned.output
    data = json.loads(a30("plan", "-f", "FILE", "-c", "halves", "-o", "json").stdout)
    assert [g["mode_pending"] for g in data["gpus"]] == ["a reboot of this (passthrough) VM"] * 4
