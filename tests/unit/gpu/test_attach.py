"""The driver's attach state (agent.gpu.attach): probe, attach, check, detach, the guard."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import cli
from agent.errors import AgentError, DriverNotReady
from agent.gpu import load_driver
from agent.gpu.attach import (
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    NO_GPUS,
    DriverCollector,
    DriverLink,
)
from agent.gpu.sim import SimControl


def _ready(link: DriverLink) -> tuple[str, float]:
    (sample,) = next(iter(DriverCollector(link).collect())).samples
    return sample.labels["reason"], sample.value


def test_no_nvml_here_is_a_state_naming_the_simulator_never_a_fallback(tmp_path: Path) -> None:
    link = DriverLink(load_driver(None, tmp_path), simulated=False, env={})
    missing = link.probe()
    assert missing is not None and missing.cause == LIBRARY_NOT_FOUND
    assert "--simulate" in missing.reason
    assert _ready(link) == (LIBRARY_NOT_FOUND, 0.0)
    with pytest.raises(DriverNotReady, match=r"mig apply needs the NVIDIA driver.*--simulate"):
        link.require("mig apply")
    assert not (tmp_path / "sim").exists()


def test_the_simulated_driver_comes_goes_and_comes_back(tmp_path: Path) -> None:
    link = DriverLink(load_driver("dgx-h100", tmp_path), simulated=True)
    control = SimControl(tmp_path)
    control.driver_absent()
    missing = link.probe()
    assert missing is not None and missing.cause == LIBRARY_NOT_FOUND  # nothing loaded yet

    control.driver_present()
    assert link.probe() is None
    link.attached(len(link.driver.gpus()))
    link.require("mig apply")
    assert link.check() is None
    assert _ready(link) == ("", 1.0)

    control.driver_absent()  # an upgrade unloads the module under the loaded library
    gone = link.check()
    assert gone is not None and gone.cause == DRIVER_NOT_LOADED
    link.detached(gone)
    with pytest.raises(DriverNotReady, match="went away"):
        link.require("mig apply")
    missing = link.probe()
    assert missing is not None and missing.cause == DRIVER_NOT_LOADED

    control.driver_present()
    assert link.probe() is None  # the same library initialises again: no restart
    assert len(link.driver.gpus()) == 8
    link.driver.close()


def test_driver_absent_for_a_time_ends_by_itself(tmp_path: Path) -> None:
    link = DriverLink(load_driver("dgx-h100", tmp_path), simulated=True)
    SimControl(tmp_path).driver_absent(for_s=0.2)
    assert link.probe() is not None
    time.sleep(0.25)
    assert link.probe() is None
    link.driver.close()


def test_sim_driver_absent_refuses_a_bad_duration_naming_the_option(tmp_path: Path) -> None:
    args = ["--simulate", "dgx-h100", "--state-dir", str(tmp_path), "sim"]
    bad = CliRunner().invoke(cli, [*args, "driver-absent", "--for", "soon"])
    assert bad.exit_code == 2 and "--for must be a duration" in bad.output
    assert SimControl(tmp_path).describe()["driver_loaded"]
    good = CliRunner().invoke(cli, [*args, "driver-absent", "--for", "2m"])
    assert good.exit_code == 0, good.output
    assert not SimControl(tmp_path).describe()["driver_loaded"]
    assert CliRunner().invoke(cli, [*args, "driver-present"]).exit_code == 0
    assert SimControl(tmp_path).describe()["driver_loaded"]


def test_a_gpu_that_needs_a_reset_at_start_does_not_keep_the_others_detached(
    tmp_path: Path,
) -> None:
    link = DriverLink(load_driver("dgx-h100", tmp_path), simulated=True)
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "ResetRequired", count=10**6, gpu=1)
    assert link.probe() is None  # the node attaches: seven GPUs answer
    scan = link.driver.scan()
    assert [g.index for g in scan.gpus] == [0, 2, 3, 4, 5, 6, 7] and not scan.lost
    (bad,) = scan.unread
    assert bad.index == 1 and "nvmlDeviceGetMigMode" in bad.detail
    with pytest.raises(AgentError, match=r"GPU 1 cannot be read: nvmlDeviceGetMigMode"):
        link.driver.gpu(1)
    link.driver.close()


def test_no_gpu_read_at_start_is_not_ready_naming_each_gpu_and_the_call(tmp_path: Path) -> None:
    link = DriverLink(load_driver("dgx-h100", tmp_path), simulated=True)
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", count=10**6)
    missing = link.probe()
    assert missing is not None and missing.cause == NO_GPUS
    assert "GPU 0 cannot be read: nvmlDeviceGetMigMode" in missing.reason
    assert "GPU 7 cannot be read" in missing.reason


class _Done(Exception):
    """Ends `DriverLink.follow`, which runs until the agent stops."""


def test_a_missing_driver_is_probed_after_a_quarter_second_doubling_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md: 0.25 s, doubling up to ``driver.retry_max_s``; once attached the
    check runs every ``check_s``, and a driver gone again starts the back-off over. The waits
    are recorded, not slept; the driver is the simulator's."""
    link = DriverLink(load_driver("dgx-h100", tmp_path), simulated=True)
    control = SimControl(tmp_path)
    control.driver_absent()
    waits: list[float] = []
    yield_to_the_loop = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 7:
            control.driver_present()  # the probe after this wait attaches
        elif seconds == 3.0:
            control.driver_absent()  # the check after this wait finds it gone
        elif len(waits) > 9:
            raise _Done
        await yield_to_the_loop(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(_Done):
        asyncio.run(
            link.follow(
                attached=False, check_s=3.0, retry_max_s=5.0, count=lambda: len(link.driver.gpus())
            )
        )
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 3.0, 0.25, 0.5]
    link.driver.close()
