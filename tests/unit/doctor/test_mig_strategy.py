"""sharing/mig-strategy: does the device plugin expose the MIG devices the node has?

The plugin takes migStrategy from its --mig-strategy flag or MIG_STRATEGY environment when set, else
from its config file, else none (k8s-device-plugin api/config/v1/flags.go UpdateFromCLIFlags), and
under none it advertises a MIG-enabled GPU whole, with none of its MIG devices (internal/rm/
device_map.go buildGPUDeviceMap). Before this check, `share show` and the doctor said nothing of a
node whose MIG layout the plugin does not expose."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from agent.doctor import node_checks
from agent.dra.mode import Allocation, AllocationMode
from agent.gpu.attach import DriverLink, DriverState
from agent.gpu.types import GpuLayout
from agent.sharing import strategy
from agent.telemetry.snapshot import Snapshot
from agent.wire.doctor import CheckState
from tests.unit.doctor.support import facts
from tests.unit.sharing.layouts import full_gpu, mig_gpu

MIXED_NODE = (mig_gpu(0, "3g.40gb", "2g.20gb", "1g.10gb"), full_gpu(1))
ONE_PROFILE_NODE = (mig_gpu(0, "1g.10gb", "1g.10gb"), mig_gpu(1, "1g.10gb"))


def _attached() -> DriverLink:
    state = DriverState(True, "", "", time.time(), 1)
    return cast(DriverLink, SimpleNamespace(state=state, is_attached=True, driver=None))


def _node(
    root: Path,
    layouts: tuple[GpuLayout, ...],
    *,
    file: str | None = None,
    argv: list[str] | None = None,
    environ: dict[str, str] | None = None,
) -> node_checks.Facts:
    """Facts of a node with ``layouts``, the plugin's config ``file`` and, when ``argv`` is
    given, a visible plugin process started with ``argv`` and ``environ`` (None: unreadable)."""
    made = facts(root, driver=_attached(), proc=root / "proc")
    path = root / "plugin" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if file is not None:
        path.write_text(file)
    sharing = dataclasses.replace(made.config.sharing, config_path=path)
    (root / "proc").mkdir(exist_ok=True)
    if argv is not None:
        pid = root / "proc" / "4321"
        pid.mkdir()
        (pid / "comm").write_text("nvidia-device-p\n")  # the kernel keeps 15 bytes
        (pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        env = pid / "environ"
        if environ is None:
            env.mkdir()  # reading it fails, as /proc/PID/environ does without ptrace rights
        else:
            env.write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    snap = Snapshot(0.0, "n", "550.90.07", "12.550", (), (), layouts=layouts)
    return dataclasses.replace(
        made,
        config=dataclasses.replace(made.config, sharing=sharing),
        snapshot=lambda: snap,
    )


def test_mig_enabled_under_the_plugin_s_default_strategy_is_degraded_with_the_share_fix(
    tmp_path: Path,
) -> None:
    check = node_checks.sharing_mig_strategy(_node(tmp_path, MIXED_NODE))
    assert check.state is CheckState.DEGRADED
    assert "MIG is enabled on GPU(s) 0 but migStrategy is none" in check.evidence
    assert "none of their 3 MIG device(s)" in check.evidence
    assert "the plugin's default" in check.evidence
    assert "process is not visible" in check.evidence  # what it could not see, said
    assert check.fix.startswith("gpu-agent share set --mig-strategy mixed")


def test_the_file_s_strategy_is_used_and_mixed_exposes_any_layout(tmp_path: Path) -> None:
    node = _node(tmp_path, MIXED_NODE, file="version: v1\nflags:\n  migStrategy: mixed\n")
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.OK
    assert "migStrategy mixed exposes the MIG layout (the config file's" in check.evidence


def test_single_on_a_node_of_two_profiles_advertises_nothing(tmp_path: Path) -> None:
    node = _node(tmp_path, MIXED_NODE, file="flags:\n  migStrategy: single\n")
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.DEGRADED
    assert "some GPUs have MIG enabled and others not" in check.evidence
    assert "advertises nvidia.com/gpu 0 here" in check.evidence
    same = _node(tmp_path / "b", ONE_PROFILE_NODE, file="flags:\n  migStrategy: single\n")
    assert node_checks.sharing_mig_strategy(same).state is CheckState.OK


def test_the_plugin_s_environment_overrides_the_file_and_the_fix_says_where_to_change_it(
    tmp_path: Path,
) -> None:
    """The GPU Operator sets MIG_STRATEGY on the plugin: a file's mixed is then ignored."""
    node = _node(
        tmp_path,
        MIXED_NODE,
        file="flags:\n  migStrategy: mixed\n",
        argv=["nvidia-device-plugin", "--config-file=/etc/nvidia-device-plugin/config.yaml"],
        environ={"PATH": "/usr/bin", "MIG_STRATEGY": "none"},
    )
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.DEGRADED
    assert "the plugin's MIG_STRATEGY environment variable" in check.evidence
    assert "ClusterPolicy's mig.strategy" in check.fix and "share set" not in check.fix


def test_the_plugin_s_flag_wins_over_its_environment(tmp_path: Path) -> None:
    node = _node(
        tmp_path,
        MIXED_NODE,
        argv=["nvidia-device-plugin", "--mig-strategy", "mixed"],
        environ={"MIG_STRATEGY": "none"},
    )
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.OK and "the plugin's --mig-strategy flag" in check.evidence


def test_an_unreadable_environment_is_said_not_guessed(tmp_path: Path) -> None:
    node = _node(tmp_path, MIXED_NODE, file="flags:\n  migStrategy: mixed\n", argv=["p"])
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.OK
    assert "environment of pid 4321 is not readable: MIG_STRATEGY unknown" in check.evidence


def test_no_mig_enabled_gpu_is_served_by_every_strategy(tmp_path: Path) -> None:
    node = _node(tmp_path, (full_gpu(0), full_gpu(1)))
    assert node_checks.sharing_mig_strategy(node).state is CheckState.OK


def test_under_dra_there_is_no_plugin_to_check(tmp_path: Path) -> None:
    node = dataclasses.replace(
        _node(tmp_path, MIXED_NODE),
        allocation=lambda: Allocation(AllocationMode.DRA, "DeviceClass gpu.nvidia.com"),
    )
    check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.OK and "no device plugin" in check.evidence


def test_without_nvml_the_strategy_is_not_checked_and_not_said_to_be_ok(tmp_path: Path) -> None:
    """It said ok, "not checked: no NVML": a check that was not made is not a pass."""
    check = node_checks.sharing_mig_strategy(facts(tmp_path))  # the driver is not attached
    assert check.state is CheckState.FAILED
    assert check.evidence == "no NVML: no MIG layout to hold the strategy against"
    assert check.fix.startswith("fix telemetry/nvml first")


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["p", "--mig-strategy=single"], {}, "single"),
        (["p", "-mig-strategy", "mixed"], {}, "mixed"),
        (["p", "--mig-strategy=none", "--mig-strategy=mixed"], {}, "mixed"),  # the last wins
        (["p", "--", "--mig-strategy=mixed"], {"MIG_STRATEGY": "single"}, "single"),
        (["p", "---mig-strategy=mixed"], {}, None),  # Go's flag package refuses three dashes
        (["p", "--mig-strategy-other=mixed"], {}, None),
        (["p"], {"MIG_STRATEGY": ""}, ""),  # set but empty: the plugin refuses it
    ],
)
def test_the_plugin_s_own_setting_is_read_as_go_s_flag_parsing_reads_it(
    argv: list[str], environ: dict[str, str], expected: str | None
) -> None:
    found = strategy.started_with(argv, environ)
    assert (found.value if found is not None else None) == expected


def test_a_strategy_the_plugin_does_not_know_is_said_to_stop_it() -> None:
    why = strategy.problem("", MIXED_NODE)
    assert why is not None and "the plugin refuses to start" in why


def test_only_the_strategy_is_taken_from_the_plugin_s_environment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/security.md: the plugin's environment may hold a token; no check shows it."""
    secret = "s3cr3t-token-value"
    node = _node(
        tmp_path,
        MIXED_NODE,
        argv=["nvidia-device-plugin", f"--registry-token={secret}"],
        environ={"NGC_API_KEY": secret, "MIG_STRATEGY": "none"},
    )
    with caplog.at_level("DEBUG"):
        check = node_checks.sharing_mig_strategy(node)
    assert check.state is CheckState.DEGRADED
    assert secret not in check.evidence + check.fix + caplog.text
