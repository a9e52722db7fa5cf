"""The doctor's checks on crafted conditions: each says the state, the evidence and the one fix
an operator needs, and a check that errs or hangs is failed, never a failed doctor."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.doctor import api_checks, gpu_checks, node_checks
from agent.doctor.runner import Probe, run_checks
from agent.doctor.service import CHECKS, Doctor
from agent.gpu.attach import LIBRARY_NOT_FOUND, DriverLink, DriverState
from agent.gpu.readings import GpuIdentity
from agent.statedir import Unwritable
from agent.telemetry.snapshot import FieldSupport, GpuStatus, Snapshot, SourceStatus
from agent.wire.doctor import Check, CheckState
from tests.unit.doctor.support import detached, facts, volume


def test_a_socket_dir_others_may_write_fails_with_the_chmod_that_fixes_it(tmp_path: Path) -> None:
    f = facts(tmp_path)
    directory = f.socket_path.parent
    directory.mkdir()
    os.chmod(directory, 0o777)
    check = api_checks.api_socket_dir(f)
    assert check.state is CheckState.FAILED
    assert "group or others may write it" in check.evidence and "0777" in check.evidence
    assert check.fix == f"chmod 0700 {directory}"
    os.chmod(directory, 0o700)
    assert api_checks.api_socket_dir(f).state is CheckState.OK


def test_a_nearly_full_cache_volume_is_degraded_and_a_full_one_failed(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    nearly = node_checks.prewarm_cache_volume(facts(tmp_path, statvfs=volume(1000, 60)))
    assert nearly.state is CheckState.DEGRADED
    assert "nearly full" in nearly.evidence and "94% used" in nearly.evidence
    assert "free space" in nearly.fix
    full = node_checks.prewarm_cache_volume(facts(tmp_path, statvfs=volume(1000, 5)))
    assert full.state is CheckState.FAILED and "gpu-agent cache evict" in full.fix
    roomy = node_checks.prewarm_cache_volume(facts(tmp_path, statvfs=volume(1000, 600)))
    assert roomy.state is not CheckState.FAILED and "40% used" in roomy.evidence


def test_no_nvml_fails_telemetry_naming_library_not_found_and_each_gpu_duty_points_at_it(
    tmp_path: Path,
) -> None:
    f = facts(tmp_path, driver=detached(LIBRARY_NOT_FOUND, "cannot use NVML (not found)"))
    nvml = gpu_checks.telemetry_nvml(f)
    assert nvml.state is CheckState.FAILED
    assert "library_not_found" in nvml.evidence
    assert "install the NVIDIA driver" in nvml.fix
    in_pod = gpu_checks.telemetry_nvml(
        facts(tmp_path, driver=f.driver, env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    )
    assert "runtimeClassName: nvidia" in in_pod.fix
    for check in (gpu_checks.mig_capability, gpu_checks.power_limits, gpu_checks.health_xid):
        found = check(f)
        assert found.state is CheckState.FAILED and "telemetry/nvml" in found.fix


def test_a_state_dir_that_takes_no_writes_fails_with_the_fix(tmp_path: Path) -> None:
    gone = Unwritable(tmp_path / "state", 30, "Read-only file system")
    check = node_checks.state_dir(facts(tmp_path, state_read_only=lambda: gone))
    assert check.state is CheckState.FAILED
    assert "Read-only file system" in check.evidence and "remount it read-write" in check.fix


def test_a_wide_open_egress_allow_is_degraded(tmp_path: Path) -> None:
    f = facts(tmp_path)
    prewarm = dataclasses.replace(f.config.prewarm, egress_allow=("10.0.0.0/8", "0.0.0.0/0"))
    wide = dataclasses.replace(f, config=dataclasses.replace(f.config, prewarm=prewarm))
    check = node_checks.prewarm_egress(wide)
    assert check.state is CheckState.DEGRADED and "0.0.0.0/0" in check.evidence
    assert node_checks.prewarm_egress(f).state is CheckState.OK


def test_private_images_are_said_refused_until_the_kubelet_verifies_or_the_operator_opts_in(
    tmp_path: Path,
) -> None:
    """The doctor shows the private-image rule (docs/security.md): no credentials, ok; with
    credentials, degraded under the kubelet's default policy naming it and both ways out; ok
    once the kubelet config says AlwaysVerify, or the operator opts in."""
    f = facts(tmp_path)
    assert node_checks.prewarm_private_images(f).state is CheckState.OK  # no credentials
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")

    def with_prewarm(**changes: object) -> object:
        prewarm = dataclasses.replace(
            f.config.prewarm, docker_config=tmp_path / "config.json", kubelet_config=kubelet,
            **changes,
        )  # fmt: skip
        return dataclasses.replace(f, config=dataclasses.replace(f.config, prewarm=prewarm))

    refused = node_checks.prewarm_private_images(with_prewarm())
    assert refused.state is CheckState.DEGRADED, refused
    assert "NeverVerifyPreloadedImages (default)" in refused.evidence
    assert "AlwaysVerify" in refused.fix and "usable-by-every-pod" in refused.fix
    kubelet.write_text(
        kubelet.read_text() + "imagePullCredentialsVerificationPolicy: AlwaysVerify\n"
    )
    assert node_checks.prewarm_private_images(with_prewarm()).state is CheckState.OK
    kubelet.unlink()
    opted = node_checks.prewarm_private_images(with_prewarm(private_images="usable-by-every-pod"))
    assert opted.state is CheckState.OK and "operator's choice" in opted.evidence


def test_a_check_that_raises_or_hangs_is_failed_and_the_run_still_answers() -> None:
    release = threading.Event()

    def boom() -> Check:
        raise RuntimeError("socket vanished")

    def hang() -> Check:
        release.wait(30)
        return Check("d", "hang", CheckState.OK, "late")

    try:
        checks = run_checks(
            [
                Probe("d", "fine", lambda: Check("d", "fine", CheckState.OK, "fine")),
                Probe("d", "boom", boom),
                Probe("d", "hang", hang),
            ],
            deadline_s=0.5,
        )
    finally:
        release.set()
    assert [c.name for c in checks] == ["fine", "boom", "hang"]
    assert checks[0].state is CheckState.OK
    assert (
        checks[1].state is CheckState.FAILED
        and "RuntimeError: socket vanished" in checks[1].evidence
    )
    assert checks[2].state is CheckState.FAILED and "did not finish in 0 s" in checks[2].evidence


def test_every_check_answers_without_a_driver_and_the_gauge_carries_each_state(
    tmp_path: Path,
) -> None:
    doctor = Doctor(facts(tmp_path))
    report = doctor.run()
    assert [(c.duty, c.name) for c in report.checks] == [(d, n) for d, n, _ in CHECKS]
    assert report.worst is CheckState.FAILED
    samples = {
        (s.labels["duty"], s.labels["check"]): s.value for m in doctor.collect() for s in m.samples
    }
    assert samples[("telemetry", "nvml")] == 2
    assert samples[("kubernetes", "rbac")] == 0  # not in a cluster: nothing needs the API
    assert len(samples) == len(CHECKS)


def _attached() -> DriverLink:
    state = DriverState(True, "", "", time.time(), 1)
    return cast(DriverLink, SimpleNamespace(state=state, is_attached=True, driver=None))


def _host(root: Path, *, admin_only: str, cap_eff: str) -> Path:
    proc = root / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "params").write_text(
        f"ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: {admin_only}\n"
    )
    (proc / "self").mkdir()
    (proc / "self" / "status").write_text(f"Name:\tgpu-agent\nCapEff:\t{cap_eff}\n")
    return proc


def _profiling_snapshot(supported: bool) -> Snapshot:
    gpu = GpuIdentity(0, "GPU-0", "NVIDIA H100", "00000000:01:00.0", 0)
    return Snapshot(
        0.0, "n", "550.90.07", "12.550", (), (), support=(FieldSupport(1004, gpu, supported),)
    )


def test_profiling_restricted_to_admins_without_cap_sys_admin_fails_with_the_modprobe_fix(
    tmp_path: Path,
) -> None:
    proc = _host(tmp_path, admin_only="1", cap_eff="00000000a80425fb")  # no bit 21
    f = facts(tmp_path, driver=_attached(), proc=proc, snapshot=lambda: _profiling_snapshot(False))
    check = gpu_checks.telemetry_profiling(f)
    assert check.state is CheckState.FAILED
    assert "profiling restricted to admins" in check.evidence
    assert "NVreg_RestrictProfilingToAdminUsers=0" in check.fix
    # With CAP_SYS_ADMIN (bit 21) the restriction does not bind the agent: unsupported fields
    # are then the GPU's, degraded.
    admin = _host(tmp_path / "admin", admin_only="1", cap_eff="000001ffffffffff")
    held = gpu_checks.telemetry_profiling(dataclasses.replace(f, proc=admin))
    assert held.state is CheckState.DEGRADED and "unsupported on GPU(s) 0" in held.evidence
    fine = dataclasses.replace(f, proc=admin, snapshot=lambda: _profiling_snapshot(True))
    assert gpu_checks.telemetry_profiling(fine).state is CheckState.OK


def test_the_optional_prewarm_daemons_are_off_unset_ok_when_listening_and_degraded_when_not(
    tmp_path: Path,
) -> None:
    """Nydus and Dragonfly are used only when their socket is configured: unset is ok ("off"),
    a listening socket is ok, a configured socket that is absent is degraded with the fix that
    mounts its folder or unsets the setting (docs/troubleshooting.md, "prewarm/nydus")."""
    import socket

    checks = {"nydus_system_socket": node_checks.prewarm_nydus}
    checks["dragonfly_socket"] = node_checks.prewarm_dragonfly
    for setting, check in checks.items():
        unset = check(facts(tmp_path))
        assert unset.state is CheckState.OK
        assert unset.evidence.startswith(f"off (prewarm.{setting}")
        path = tmp_path / f"{setting}.sock"
        base = facts(tmp_path)
        configured = dataclasses.replace(
            base.config, prewarm=dataclasses.replace(base.config.prewarm, **{setting: path})
        )
        absent = check(dataclasses.replace(base, config=configured))
        assert absent.state is CheckState.DEGRADED and str(path) in absent.evidence
        assert absent.fix == f"mount {tmp_path} into the agent pod, or unset prewarm.{setting}"
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
            listener.listen()
            listening = check(dataclasses.replace(base, config=configured))
        assert listening.state is CheckState.OK and str(path) in listening.evidence


def test_a_prewarm_daemons_socket_left_behind_by_a_daemon_that_died_is_degraded_naming_it(
    tmp_path: Path,
) -> None:
    """Real Unix sockets: containerd, nydus-snapshotter and dfdaemon were ok whenever their
    socket file was there, also when the daemon had crashed and left it (every pull or fetch
    then failed "connection refused"). Now a listening socket is ok ("accepts connections"),
    one no one listens on is degraded saying so, with the fix that starts the daemon."""
    import socket

    base = facts(tmp_path)
    cases = {
        "containerd_socket": (node_checks.prewarm_containerd, "start containerd on the node"),
        "nydus_system_socket": (node_checks.prewarm_nydus, "start nydus-snapshotter, or unset"),
        "dragonfly_socket": (node_checks.prewarm_dragonfly, "start dfdaemon, or unset"),
    }
    for setting, (check, fix) in cases.items():
        path = tmp_path / f"{setting}.sock"
        prewarm = dataclasses.replace(base.config.prewarm, **{setting: path})
        configured = dataclasses.replace(
            base, config=dataclasses.replace(base.config, prewarm=prewarm)
        )
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
            listener.listen()
            live = check(configured)
        assert live.state is CheckState.OK, live
        assert live.evidence.endswith(f"{path} accepts connections"), live.evidence
        assert path.exists()  # closed: the file is left, as a crashed daemon leaves it
        stale = check(configured)
        assert stale.state is CheckState.DEGRADED, (setting, stale.evidence)
        assert f"no one listens on {path} (connection refused)" in stale.evidence, stale.evidence
        assert stale.fix.startswith(fix), stale.fix


def test_dragonfly_says_where_file_bytes_come_from_and_that_a_silent_dfdaemon_fails_them(
    tmp_path: Path,
) -> None:
    """prewarm/dragonfly looked at `dragonfly_socket` alone. With `dragonfly_proxy` set it said
    "ok: off ... files come from origins" while every file went through the proxy, and a
    proxy that was down was not reported; with a socket configured but absent it said "files
    are fetched from origins directly" while every fetch failed "dfdaemon unreachable" (there
    is no fallback). A proxy that accepts connections is ok; one that does not, and an absent
    socket, are degraded saying file fetches fail."""
    import socket

    base = facts(tmp_path)

    def with_settings(**settings: object) -> Check:
        prewarm = dataclasses.replace(base.config.prewarm, **settings)
        config = dataclasses.replace(base.config, prewarm=prewarm)
        return node_checks.prewarm_dragonfly(dataclasses.replace(base, config=config))

    absent = with_settings(dragonfly_socket=tmp_path / "df.sock")
    assert absent.state is CheckState.DEGRADED and "origins directly" not in absent.evidence
    assert "file fetches fail" in absent.evidence, absent.evidence
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
        up = with_settings(dragonfly_proxy=proxy)
    assert up.state is CheckState.OK and proxy in up.evidence, up.evidence
    down = with_settings(dragonfly_proxy=proxy)  # closed now
    assert down.state is CheckState.DEGRADED, down.evidence
    assert proxy in down.evidence and "file fetches fail" in down.evidence, down.evidence
    assert down.fix == "start dfdaemon's proxy there, or unset prewarm.dragonfly_proxy"
    unset = node_checks.prewarm_dragonfly(base)
    assert unset.state is CheckState.OK and unset.evidence.endswith("files come from origins")


def test_an_instance_mark_is_named_as_the_instance_not_the_whole_gpu(tmp_path: Path) -> None:
    """An XID the driver pins on a MIG instance fails that instance only (docs/health.md);
    doctor must say so as `gpu-agent status` does, not call the whole GPU failed."""
    from agent.health.machine import Mark, State
    from agent.health.store import Target

    failed = Mark(
        State.FAILED, "XID 48 (Double Bit ECC Error): needs reset-gpu", action="reset-gpu"
    )
    marks = {
        Target("GPU-1", 1): (1, failed, failed.reason),
        Target("GPU-1"): (1, Mark(), ""),
        Target("GPU-3"): (3, dataclasses.replace(failed, action="reboot-node"), "XID 79"),
        # lost before it was read, then read: two marks of one index (ordered without a Mark)
        Target.gpu("", 3): (3, dataclasses.replace(failed, action="reboot-node"), "GPU lost"),
    }
    f = facts(tmp_path, driver=_attached(), marks=lambda: marks)
    check = gpu_checks.health_xid(f)
    assert check.state is CheckState.FAILED
    assert "GPU 1 GPU instance 1 failed: XID 48" in check.evidence
    assert "GPU 1 failed" not in check.evidence
    assert check.evidence.index("GPU 1 GPU instance 1") < check.evidence.index("GPU 3 failed")
    assert "reboot-node" in check.fix  # the strongest action of the marks, in any order


def test_profiling_evidence_counts_the_readable_fields_not_the_selected_ones(
    tmp_path: Path,
) -> None:
    """A GPU without GPM reads no profiling field: the evidence must not claim readings."""
    proc = _host(tmp_path, admin_only="0", cap_eff="000001ffffffffff")
    f = facts(tmp_path, driver=_attached(), proc=proc, snapshot=lambda: _profiling_snapshot(False))
    check = gpu_checks.telemetry_profiling(f)
    assert check.state is CheckState.DEGRADED
    assert check.evidence.startswith("0 of 1 profiling field reading(s) supported")
    fine = dataclasses.replace(f, snapshot=lambda: _profiling_snapshot(True))
    assert gpu_checks.telemetry_profiling(fine).evidence.startswith(
        "1 of 1 profiling field reading(s) supported"
    )


def test_health_xid_is_degraded_while_xid_events_are_not_watched(tmp_path: Path) -> None:
    """With the NVML event set broken no XID reaches the marks: "every GPU healthy" would say
    yes where the truth is unknown. The check says the watch is down, with its reason."""
    broken = "cannot open the NVML event set: nvmlEventSetCreate: Unknown Error"
    f = facts(tmp_path, driver=_attached(), xid_unwatched=lambda: broken)
    check = gpu_checks.health_xid(f)
    assert check.state is CheckState.DEGRADED
    assert f"XID events are not watched: {broken}" in check.evidence
    assert "every GPU healthy" not in check.evidence
    assert "a failing NVML event set is reopened on its own" in check.fix
    fine = gpu_checks.health_xid(dataclasses.replace(f, xid_unwatched=lambda: None))
    assert fine.state is CheckState.OK and "every GPU healthy" in fine.evidence


def test_a_gpu_whose_xids_are_not_delivered_is_named_not_called_healthy(tmp_path: Path) -> None:
    """GPU 2 was lost when the XID events were registered: none of its XIDs arrive until a
    tick finds it answering, so the agent's XID watcher names it and the check does not call it
    healthy. `status`' xid-events component leaves it out: it says the GPU lost already."""
    from agent.config import TelemetrySettings
    from agent.gpu import open_driver
    from agent.gpu.sim import SimControl
    from agent.telemetry.service import build_telemetry

    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    SimControl(state).mark_lost(2)
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock")
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.xids.start()
    try:
        f = facts(tmp_path, driver=_attached(), xid_unwatched=service.xid_unwatched)
        check = gpu_checks.health_xid(f)
        assert service.xid_unwatched(answering=True) is None
    finally:
        service.xids.stop()
        driver.close()
    assert check.state is CheckState.DEGRADED
    assert "XID events are not watched: GPU 2: " in check.evidence


def test_a_plugin_config_the_plugin_cannot_read_fails_plugin_config_naming_why(
    tmp_path: Path,
) -> None:
    """sharing/plugin-config said "config path ... (present), directory writable" (ok) of a
    directory at the config's path, and of a file the plugin refuses to parse, while every
    `share` command refused them: the check now reads the file as `share` does and fails,
    naming what is wrong (docs/troubleshooting.md, sharing/plugin-config)."""
    made = facts(tmp_path)
    path = tmp_path / "plugin" / "config.yaml"
    path.parent.mkdir()
    sharing = dataclasses.replace(made.config.sharing, config_path=path)
    f = dataclasses.replace(made, config=dataclasses.replace(made.config, sharing=sharing))
    assert node_checks.sharing_plugin_config(f).state is CheckState.OK  # not written yet
    path.mkdir()
    check = node_checks.sharing_plugin_config(f)
    assert check.state is CheckState.FAILED, check
    assert f"{path} is a directory" in check.evidence and check.fix
    path.rmdir()
    path.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n")
    check = node_checks.sharing_plugin_config(f)
    assert check.state is CheckState.FAILED, check
    assert "sharing.timeSlicing.resources[0].replicas: required" in check.evidence
    # Its fix says `share show` says the same: it does, word for word (one reader of the file).
    from agent.config.sections import SharingSettings
    from agent.errors import Conflict
    from agent.sharing.service import SharingService

    with pytest.raises(Conflict) as refused:
        SharingService(SharingSettings(config_path=path, reload="none"), tuple).show()
    assert check.evidence.endswith(str(refused.value)), (check.evidence, refused.value)
    path.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    assert node_checks.sharing_plugin_config(f).state is CheckState.OK


@contextlib.contextmanager
def _gpu3_lost_after_the_read(tmp_path: Path) -> Iterator[tuple[DriverLink, tuple[Any, ...]]]:
    """An attached H100 node whose layouts were read, then GPU 3 stopped answering."""
    from agent.gpu import open_driver
    from agent.gpu.sim import SimControl

    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    try:
        layouts = tuple(driver.layout(g.uuid) for g in driver.gpus())
        SimControl(state).mark_lost(3)
        yield (
            cast(DriverLink, SimpleNamespace(state=None, is_attached=True, driver=driver)),
            layouts,
        )
    finally:
        driver.close()


def test_a_gpu_lost_since_it_was_read_is_named_once_by_its_index_in_power_limits(
    tmp_path: Path,
) -> None:
    """It read 'GPU 3: GPU GPU-7365e450-…: GPU is lost': the index, then the driver's own
    naming of the same GPU by UUID. Now as telemetry/nvml says it: 'GPU 3: GPU is lost'."""
    with _gpu3_lost_after_the_read(tmp_path) as (link, layouts):
        snap = cast(Snapshot, SimpleNamespace(layouts=layouts, gpus=()))
        check = gpu_checks.power_limits(facts(tmp_path, driver=link, snapshot=lambda: snap))
    assert check.state is CheckState.DEGRADED
    assert check.evidence.endswith("; GPU 3: GPU is lost"), check.evidence


def test_power_limits_are_degraded_while_the_stored_spec_is_not_in_force(tmp_path: Path) -> None:
    """Every limit readable, but the spec's 300 W refused on GPU 0 at each re-apply (after a
    reboot): it said ok ("set 400 W") and the refusal was one log line. Now it names it."""
    from agent.gpu import open_driver

    driver = open_driver("dgx-h100", tmp_path / "state")
    try:
        link = cast(DriverLink, SimpleNamespace(state=None, is_attached=True, driver=driver))
        layouts = tuple(driver.layout(g.uuid) for g in driver.gpus())
        snap = cast(Snapshot, SimpleNamespace(layouts=layouts, gpus=()))
        apart = ["GPU 0: 300 W asked, 700 W held (Insufficient Permissions)"]
        check = gpu_checks.power_limits(
            facts(tmp_path, driver=link, snapshot=lambda: snap, power_out_of_force=lambda: apart)
        )
        held = gpu_checks.power_limits(facts(tmp_path, driver=link, snapshot=lambda: snap))
    finally:
        driver.close()
    assert check.state is CheckState.DEGRADED
    assert check.evidence == "power spec not in force: " + apart[0]
    assert "nvidia-smi -pl" in check.fix
    assert held.state is CheckState.OK


def test_mig_pending_does_not_vouch_for_a_gpu_that_does_not_answer(tmp_path: Path) -> None:
    """With GPU 3 lost, mig/pending said "no MIG mode change waits for a GPU reset" (ok) from
    the mode read before it stopped answering: a verdict on a GPU nobody can read. It is
    degraded now, naming the GPU and the driver's error."""
    with _gpu3_lost_after_the_read(tmp_path) as (link, layouts):
        down = SimpleNamespace(gpu=SimpleNamespace(index=3), up=False, detail="GPU is lost")
        snap = cast(Snapshot, SimpleNamespace(layouts=layouts, gpus=(down,)))
        check = gpu_checks.mig_pending(facts(tmp_path, driver=link, snapshot=lambda: snap))
        answering = cast(Snapshot, SimpleNamespace(layouts=layouts, gpus=()))
        fine = gpu_checks.mig_pending(facts(tmp_path, driver=link, snapshot=lambda: answering))
    assert check.state is CheckState.DEGRADED, check
    assert check.evidence.endswith("cannot be read: GPU 3: GPU is lost"), check.evidence
    assert fine.state is CheckState.OK, fine


def test_pod_resources_is_degraded_while_kubelet_refuses_the_list(tmp_path: Path) -> None:
    """The socket is there but kubelet's List fails (kubelet down or restarting): GPU series
    carry kubelet's last answer. The check said ok, "kubelet pod-resources socket ...", since
    it only looked for the socket; it now says what the pods source says."""
    import socket as sockets

    path = tmp_path / "kubelet.sock"
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(path))
    reason = "kubelet pod-resources List failed (UNAVAILABLE): pods as of its last answer"
    snap = Snapshot(
        0.0, "n", "550.90.07", "12.550", (), (), sources=(SourceStatus("pods", reason),)
    )
    try:
        f = facts(tmp_path, driver=_attached(), snapshot=lambda: snap)
        f = dataclasses.replace(
            f,
            config=dataclasses.replace(
                f.config,
                telemetry=dataclasses.replace(f.config.telemetry, kubelet_socket=path),
            ),
        )
        check = gpu_checks.telemetry_pod_resources(f)
        assert check.state is CheckState.DEGRADED
        assert reason in check.evidence and "kubelet" in (check.fix or "")
        up = Snapshot(0.0, "n", "550.90.07", "12.550", (), (), sources=(SourceStatus("pods"),))
        fine = gpu_checks.telemetry_pod_resources(dataclasses.replace(f, snapshot=lambda: up))
        assert fine.state is CheckState.OK
    finally:
        listener.close()


def test_a_gpu_listed_but_not_read_degrades_nvml_naming_it_and_the_call(tmp_path: Path) -> None:
    """A GPU whose MIG-mode call fails is not lost, and was not counted answering: the check
    said "7 of 8 GPU(s) answering" and ok, though nothing of that GPU was read."""
    gpus = [GpuIdentity(i, f"GPU-{i}", "NVIDIA H100", f"00000000:0{i}:00.0", i) for i in (0, 1)]
    statuses = (
        GpuStatus(gpus[0], up=True),
        GpuStatus(gpus[1], up=None, unread="nvmlDeviceGetMigMode: Unknown Error"),
    )
    snap = Snapshot(0.0, "n", "550.90.07", "12.550", statuses, ())
    f = facts(tmp_path, driver=_attached(), snapshot=lambda: snap)
    check = gpu_checks.telemetry_nvml(dataclasses.replace(f, proc=tmp_path / "no-proc"))
    assert check.state is CheckState.DEGRADED, check
    assert "1 of 2 GPU(s) answering" in check.evidence
    assert "not read: GPU 1: nvmlDeviceGetMigMode: Unknown Error" in check.evidence


def test_in_use_is_degraded_where_the_nodes_processes_are_not_visible(tmp_path: Path) -> None:
    """Doctor said nothing while the cache evicted nothing: without hostPID, or with a PID
    namespace the agent cannot read, every blob may be held by a pod it cannot see."""
    from tests.unit.sharing.pidns_fixtures import POD_NAMESPACE, a_proc, node_proc

    def scanned(proc: Path) -> Any:  # the /proc the cache's scan reads: telemetry.proc_root
        made = facts(tmp_path)
        telemetry = dataclasses.replace(made.config.telemetry, proc_root=proc)
        return dataclasses.replace(
            made, config=dataclasses.replace(made.config, telemetry=telemetry)
        )

    seen = node_checks.prewarm_in_use(scanned(node_proc(tmp_path / "n")))
    assert seen.state is CheckState.OK, seen
    pod = a_proc(tmp_path / "pod", POD_NAMESPACE, "7")
    hidden = node_checks.prewarm_in_use(scanned(pod))
    assert hidden.state is CheckState.DEGRADED
    assert "no hostPID" in hidden.evidence and "none is evicted for room" in hidden.evidence
    assert "hostPID: true" in hidden.fix
    unread = a_proc(tmp_path / "unread", None, "7")
    unknown = node_checks.prewarm_in_use(scanned(unread))
    assert unknown.state is CheckState.DEGRADED
    assert "PID namespace could not be read" in unknown.evidence


def test_the_start_log_says_the_missing_driver_once_and_names_what_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node waiting for its driver logged seven ERROR lines at start, six of them "no NVML:
    fix telemetry/nvml first". One failed check is the cause: it is the one ERROR, and the
    checks that wait for it are one WARNING line naming them."""
    f = facts(tmp_path, driver=detached(LIBRARY_NOT_FOUND, "cannot use NVML (not found)"))
    doctor = Doctor(f)
    with caplog.at_level(logging.INFO, logger="agent.doctor.service"):
        doctor.refresh()
    service = [r for r in caplog.records if r.name == "agent.doctor.service"]
    lines = [(r.levelno, r.getMessage()) for r in service]
    errors = [m.split()[1] for level, m in lines if level == logging.ERROR]
    assert "telemetry/nvml" in errors, errors
    waiters = {"telemetry/profiling", "mig/capability", "mig/pending", "power/limits"}
    assert not waiters & set(errors), errors
    (waiting,) = [m for level, m in lines if "wait for NVML" in m and level == logging.WARNING]
    assert waiting.startswith("doctor: 6 checks wait for NVML: telemetry/profiling, mig/capability")
    assert "health/xid" in waiting
    assert not any("fix telemetry/nvml first" in m for _, m in lines)
