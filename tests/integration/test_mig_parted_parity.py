"""``gpu-agent mig`` called the way mig-manager's reconfigure-mig.sh calls nvidia-mig-parted.

Each test runs bash with ``nvidia-mig-parted`` defined as ``gpu-agent ... mig`` on a simulated
node, the same commands, flags and environment variables as the script, and checks the exit
statuses and messages it branches on (docs/mig.md, "mig-parted's commands").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.mig.plan import plan_gpu
from agent.mig.spec import parse_spec, select_gpus
from tests.unit.api.support import REPO
from tests.unit.mig.simnode import sim_node

pytestmark = pytest.mark.integration

CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices: {1g.5gb: 7}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {1g.5gb: 2, 2g.10gb: 1, 3g.20gb: 1}
  a100-sxm4-40gb-by-subsystem:
    - device-filter: "0x20B010DE:0x134F10DE"
      devices: all
      mig-enabled: true
      mig-devices: {3g.20gb: 2}
"""


def bash(tmp_path: Path, preset: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with nvidia-mig-parted and gpu-sim pointing at a simulated node."""
    (tmp_path / "config.yaml").write_text(CONFIG)
    agent = f"{sys.executable} -m agent.cli.main --simulate {preset} --state-dir {tmp_path / 's'}"
    prelude = f"""
set -u
nvidia-mig-parted() {{ {agent} mig "$@"; }}
gpu-sim() {{ {agent} sim "$@"; }}
MIG_CONFIG_FILE={tmp_path / "config.yaml"}
"""
    return subprocess.run(
        ["bash", "-c", prelude + script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_reconfigure_script_reboots_a_passthrough_vm_then_applies(tmp_path: Path) -> None:
    """reconfigure-mig.sh's sequence on Ampere in a passthrough VM: `apply --mode-only` leaves
    the mode pending, `assert --mode-only` fails (the script sets `rebooting` and reboots), and
    after the reboot the same calls pass and `apply` makes the instances."""
    open_driver("dgx-a100", tmp_path / "s").close()
    SimControl(tmp_path / "s").set_passthrough_vm(True)
    done = bash(
        tmp_path,
        "dgx-a100",
        """
F=${MIG_CONFIG_FILE}; C=all-balanced  # SELECTED_MIG_CONFIG in the script
nvidia-mig-parted assert --valid-config -f $F -c $C; echo "valid=$?"
nvidia-mig-parted assert -f $F -c $C; echo "assert=$?"
nvidia-mig-parted assert --mode-only -f $F -c $C; echo "mode=$?"
nvidia-mig-parted -d apply --mode-only -f $F -c $C; echo "apply-mode=$?"
nvidia-mig-parted -d assert --mode-only -f $F -c $C; echo "mode-after=$?"
gpu-sim reboot
nvidia-mig-parted assert --mode-only -f $F -c $C; echo "mode-rebooted=$?"
nvidia-mig-parted -d apply -f $F -c $C; echo "apply=$?"
nvidia-mig-parted assert -f $F -c $C; echo "assert-end=$?"
""",
    )
    codes = dict(line.split("=") for line in done.stdout.splitlines() if "=" in line)
    assert codes == {
        "valid": "0",
        "assert": "1",
        "mode": "1",
        "apply-mode": "14",  # pending: not success (mig-parted would say 0 here)
        "mode-after": "1",
        "mode-rebooted": "0",
        "apply": "0",
        "assert-end": "0",
    }, done.stdout + done.stderr
    assert "Selected MIG configuration is valid" in done.stdout
    assert "Assertion failure: selected configuration not currently applied" in done.stderr
    assert "MIG configuration applied successfully" in done.stdout
    assert "Selected MIG configuration currently applied" in done.stdout
    assert " DEBUG " in done.stderr, "-d gives debug logging"


def test_mode_only_changes_the_mode_and_keeps_what_needs_no_change(tmp_path: Path) -> None:
    node = sim_node(tmp_path / "s", "dgx-a100")
    spec = parse_spec(CONFIG)
    node.service.apply(spec, "all-1g.5gb")
    before = node.states()
    node.close()
    same = bash(
        tmp_path,
        "dgx-a100",
        "MIG_PARTED_MODE_CHANGE_ONLY=true nvidia-mig-parted apply -f ${MIG_CONFIG_FILE} "
        "-c all-balanced",
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert "[1] apply" not in same.stderr  # every GPU is in that mode: nothing to change
    node = sim_node(tmp_path / "s", "dgx-a100")
    assert node.states() == before, "mode-only touched the instances"
    node.close()
    done = bash(
        tmp_path,
        "dgx-a100",
        """
nvidia-mig-parted apply -m -f ${MIG_CONFIG_FILE} -c all-disabled; echo "disable=$?"
nvidia-mig-parted assert -m -f ${MIG_CONFIG_FILE} -c all-disabled; echo "assert=$?"
""",
    )
    codes = dict(line.split("=") for line in done.stdout.splitlines() if "=" in line)
    assert codes == {"disable": "0", "assert": "0"}, done.stdout + done.stderr
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:
        assert all(not s.mig_enabled and not s.instances for s in node.states().values())
    finally:
        node.close()


def test_a_subsystem_filter_selects_the_same_gpus_in_plan_apply_and_assert(
    tmp_path: Path,
) -> None:
    """``0xDDDDVVVV:0xSSSSVVVV``: plan and assert read the GPUs through the API, apply through
    the driver; all three select the same ones (the API carries the subsystem id)."""
    for name, text in (("octal", "0123"), ("bad", "09")):
        (tmp_path / f"{name}.yaml").write_text(
            f"version: v1\nmig-configs:\n  {name}:\n    - {{device-filter: '{text}', "
            "devices: all, mig-enabled: false}\n"
        )
    done = bash(
        tmp_path,
        "dgx-a100",
        """
F=${MIG_CONFIG_FILE}; C=a100-sxm4-40gb-by-subsystem
nvidia-mig-parted plan -f $F -c $C; echo "plan=$?"
nvidia-mig-parted apply -f $F -c $C; echo "apply=$?"
nvidia-mig-parted assert -f $F -c $C; echo "assert=$?"
nvidia-mig-parted assert --valid-config -f DIR/octal.yaml -c octal; echo "octal=$?"
nvidia-mig-parted assert --valid-config -f DIR/bad.yaml -c bad; echo "bad=$?"
""".replace("DIR", str(tmp_path)),
    )
    codes = dict(line.split("=") for line in done.stdout.splitlines() if "=" in line)
    out = done.stdout + done.stderr
    assert codes == {
        "plan": "0",
        "apply": "0",
        "assert": "0",
        "octal": "0",  # Go reads 0123 as octal, as mig-parted does
        "bad": "2",
    }, out
    assert "GPU 0-7  NVIDIA A100-SXM4-40GB (mig-configs.a100-sxm4-40gb-by-subsystem[0]): " in out
    assert "mig-configs.bad[0].device-filter: invalid DeviceID format '09'" in out
    assert "Traceback" not in out
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:
        assert all(len(s.instances) == 2 for s in node.states().values())
    finally:
        node.close()


HOOKS = """\
version: v1
hooks:
  apply-start:
    - command: /bin/sh
      args:
        - -c
        - echo apply-start $MIG_PARTED_SELECTED_CONFIG $MIG_PARTED_MODE_CHANGE_ONLY >> {log}
  pre-apply-mode:
    - command: /bin/sh
      args: ["-c", "echo pre-apply-mode >> {log}"]
  pre-apply-config:
    - command: /bin/sh
      args: ["-c", "echo pre-apply-config $WHO >> {log}"]
      envs: {{WHO: hook}}
  apply-exit:
    - command: /bin/sh
      args: ["-c", "echo apply-exit >> {log}"]
"""


def test_hooks_run_in_mig_parteds_order_only_for_the_phases_that_run(tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    (tmp_path / "hooks.yaml").write_text(HOOKS.format(log=log))
    done = bash(
        tmp_path,
        "dgx-a100",
        f"""
export MIG_PARTED_HOOKS_FILE={tmp_path / "hooks.yaml"}
nvidia-mig-parted apply -f ${{MIG_CONFIG_FILE}} -c all-balanced; echo "first=$?"
echo --- >> {log}
nvidia-mig-parted apply -f ${{MIG_CONFIG_FILE}} -c all-1g.5gb; echo "second=$?"
echo --- >> {log}
nvidia-mig-parted apply -f ${{MIG_CONFIG_FILE}} -c all-1g.5gb; echo "third=$?"
""",
    )
    assert "first=0" in done.stdout and "second=0" in done.stdout, done.stdout + done.stderr
    assert "third=0" in done.stdout
    runs = log.read_text().split("---\n")
    assert runs[0].splitlines() == [
        "apply-start all-balanced false",
        "pre-apply-mode",
        "pre-apply-config hook",
        "apply-exit",
    ]
    # The mode is right already: no pre-apply-mode. Nothing to do at all: only start and exit.
    assert runs[1].splitlines() == [
        "apply-start all-1g.5gb false",
        "pre-apply-config hook",
        "apply-exit",
    ]
    assert runs[2].splitlines() == ["apply-start all-1g.5gb false", "apply-exit"]


def test_a_failing_hook_stops_the_apply_and_apply_exit_still_runs(tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    hooks = yaml.safe_load(HOOKS.format(log=log))
    hooks["hooks"]["pre-apply-config"] = [
        {"command": "/bin/sh", "args": ["-c", "echo no >&2; exit 3"]}
    ]
    (tmp_path / "hooks.yaml").write_text(yaml.safe_dump(hooks))
    done = bash(
        tmp_path,
        "dgx-a100",
        f"nvidia-mig-parted apply -k {tmp_path / 'hooks.yaml'} -f ${{MIG_CONFIG_FILE}} "
        "-c all-balanced; echo rc=$?",
    )
    assert "rc=1" in done.stdout, done.stdout + done.stderr
    assert "error running pre-apply-config hook: /bin/sh exited 3: no" in done.stderr
    assert log.read_text().splitlines()[-1] == "apply-exit"
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:  # the mode phase ran, the config phase did not
        assert all(s.mig_enabled and not s.instances for s in node.states().values())
    finally:
        node.close()


def test_a_bad_hooks_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "hooks.yaml").write_text("version: v1\nhooks:\n  post-apply: []\n")
    done = bash(
        tmp_path,
        "dgx-a100",
        f"nvidia-mig-parted apply -k {tmp_path / 'hooks.yaml'} -f ${{MIG_CONFIG_FILE}} "
        "-c all-balanced; echo rc=$?",
    )
    assert "rc=2" in done.stdout
    assert "hooks.post-apply: unknown hook; allowed: apply-start, pre-apply-mode" in done.stderr


@pytest.mark.parametrize("preset", ["dgx-a100", "a30-node", "mixed"])
def test_generate_config_emits_every_layout_and_round_trips(tmp_path: Path, preset: str) -> None:
    out = tmp_path / "gen.json"
    done = bash(tmp_path, preset, f"nvidia-mig-parted generate-config -o json -f {out}")
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    spec = parse_spec(yaml.safe_dump(document))  # our parser takes it as it is
    names = set(document["mig-configs"])
    assert {"all-disabled", "all-enabled", "all-balanced"} <= names
    node = sim_node(tmp_path / "s", preset)
    try:
        layouts = node.service.layouts()
        for name in names:  # every generated config can be applied on this node
            plan = node.service.plan(spec, name)
            assert all(p.status != "infeasible" for p in plan.gpus), (name, plan)
        # ... and every layout that fits is generated: each combination of counts the planner
        # can place on a GPU of each model is one of the layout-... configs.
        for layout in {lay.gpu.pci_device_id: lay for lay in layouts}.values():
            wanted = _fitting_combinations(layout)
            entries = [
                e
                for n in names
                if n.startswith("layout-")
                for _, es in [spec.select(n)]
                for e in es
                if any(s.gpu.uuid == layout.gpu.uuid for s in select_gpus(es, [layout.gpu]))
            ]
            have = {tuple(sorted(e.mig_devices)) for e in entries}
            assert have == wanted, (layout.gpu.name, wanted ^ have)
    finally:
        node.close()


def _fitting_combinations(layout: object) -> set[tuple[tuple[str, int], ...]]:
    """Brute force over every count of every profile, asked of the planner."""
    from itertools import product

    from agent.mig.desired import Desired

    profiles = layout.profiles  # type: ignore[attr-defined]
    ranges = [range(p.instance_count + 1) for p in profiles]
    out = set()
    for counts in product(*ranges):
        wanted = tuple(sorted((p.name, n) for p, n in zip(profiles, counts, strict=True) if n))
        if not wanted:
            continue
        plan = plan_gpu(layout, Desired(True, wanted))  # type: ignore[arg-type]
        if plan.status != "infeasible":
            out.add(wanted)
    return out


def test_checkpoint_and_restore_bring_back_placements_exactly(tmp_path: Path) -> None:
    node = sim_node(tmp_path / "s", "dgx-a100")
    spec = parse_spec(CONFIG)
    node.service.apply(spec, "all-balanced")
    before = node.states()
    node.close()
    done = bash(
        tmp_path,
        "dgx-a100",
        f"""
export MIG_PARTED_CHECKPOINT_FILE={tmp_path / "cp.json"}
nvidia-mig-parted checkpoint; echo "checkpoint=$?"
nvidia-mig-parted apply -f ${{MIG_CONFIG_FILE}} -c all-disabled >/dev/null 2>&1; echo "apply=$?"
nvidia-mig-parted restore; echo "restore=$?"
nvidia-mig-parted restore; echo "again=$?"
""",
    )
    codes = dict(line.split("=") for line in done.stdout.splitlines() if "=" in line)
    assert codes == {"checkpoint": "0", "apply": "0", "restore": "0", "again": "0"}, (
        done.stdout + done.stderr
    )
    assert "MIG configuration checkpointed successfully" in done.stdout
    assert done.stdout.count("MIG configuration restored successfully") == 2
    saved = json.loads((tmp_path / "cp.json").read_text())
    assert saved["Version"] == "v1" and len(saved["MigState"]["Devices"]) == 8
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:
        # ProfileID is the NVML constant, which mig-parted's restore hands to
        # GetGpuInstanceProfileInfo: it names the profile each instance had.
        for device in saved["MigState"]["Devices"]:
            layout = node.driver.layout(device["UUID"])
            by_constant = {p.constant: p.id for p in layout.profiles}
            written = sorted(
                (by_constant[gi["ProfileID"]], gi["Placement"]["Start"])
                for gi in device["GpuInstances"] or []
            )
            assert written == sorted(
                (gi.profile_id, gi.placement.start) for gi in before[device["UUID"]].instances
            )
        after = node.states()
        # Same placements and CIs; GI ids are the driver's to pick (§3.2).
        assert after == before
        assert not node.store.journal_entries("mig:apply")
    finally:
        node.close()


@pytest.mark.parametrize(
    ("three_g", "two_g"), [(2, 1), (9, 14)], ids=["mig-parted-constants", "older-agent-ids"]
)
def test_a_checkpoint_written_by_mig_parted_restores(
    tmp_path: Path, three_g: int, two_g: int
) -> None:
    """mig-parted's own format (no compute-instance placement): widths from the CI profile id.
    Its GPU instance ``ProfileID`` is the NVML profile constant, as go-nvlib's
    WalkGpuInstances passes it on (3g: 2, 2g: 1; reference/mig.md §1.2), not the id: this
    test held ids (9, 14) before, which mig-parted never writes; a file an agent before the
    fix wrote holds those ids and restores too (no 1g.10gb, constant 9, is 4 slices wide)."""
    node = sim_node(tmp_path / "s", "dgx-a100")
    uuids = [g.uuid for g in node.driver.gpus()]
    node.close()
    cp = {
        "Version": "v1",
        "MigState": {
            "Devices": [
                {
                    "UUID": uuids[0],
                    "MigMode": 1,
                    "GpuInstances": [
                        {
                            "ProfileID": three_g,
                            "Placement": {"Start": 4, "Size": 4},
                            "ComputeInstances": [{"ProfileID": 2, "EngProfileID": 0}],
                        },
                        {
                            "ProfileID": two_g,
                            "Placement": {"Start": 0, "Size": 2},
                            "ComputeInstances": [
                                {"ProfileID": 0, "EngProfileID": 0},
                                {"ProfileID": 0, "EngProfileID": 0},
                            ],
                        },
                    ],
                },
                {"UUID": uuids[1], "MigMode": 0, "GpuInstances": None},
            ]
        },
    }
    (tmp_path / "cp.json").write_text(json.dumps(cp))
    done = bash(tmp_path, "dgx-a100", f"nvidia-mig-parted restore -f {tmp_path / 'cp.json'}")
    assert done.returncode == 0, done.stderr
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:
        layout = node.driver.layout(uuids[0])
        got = sorted(
            (gi.profile_name, str(gi.placement), len(gi.compute_instances))
            for gi in layout.instances
        )
        assert got == [("2g.10gb", "0:2", 2), ("3g.20gb", "4:4", 1)]
        assert not node.states()[uuids[1]].mig_enabled
    finally:
        node.close()


def test_a_checkpoint_for_another_node_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    node = sim_node(tmp_path / "s", "dgx-a100")
    before = node.states()
    node.close()
    cp = {"Version": "v1", "MigState": {"Devices": [{"UUID": "GPU-elsewhere", "MigMode": 1}]}}
    (tmp_path / "cp.json").write_text(json.dumps(cp))
    done = bash(tmp_path, "dgx-a100", f"nvidia-mig-parted restore -f {tmp_path / 'cp.json'}")
    assert done.returncode == 2
    assert "MigState.Devices[0].UUID" in done.stderr and "GPU-elsewhere" in done.stderr
    node = sim_node(tmp_path / "s", "dgx-a100")
    try:
        assert node.states() == before
    finally:
        node.close()
