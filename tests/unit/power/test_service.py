"""PowerService on a simulated node: the whole spec checked before any GPU is touched, the
baselines journaled for restore, lost caps set again, and a failed apply put back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import AgentError, DeviceLost, InvalidSpec, NotSupported, PermissionDenied
from agent.gpu import GpuDriver, load_driver
from agent.gpu.sim import SimControl
from agent.power import LostTarget
from agent.power.service import BASELINE, PowerService
from agent.state import StateStore

_SPEC = "version: v1\npower:\n  - {gpus: all, limit: 0.8}\n  - {gpus: [0], limit: 300W}\n"


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[GpuDriver]:
    driver = load_driver("mixed", tmp_path, latency=False).open()
    yield driver
    driver.close()


def _service(gpu: GpuDriver, tmp_path: Path) -> PowerService:
    return PowerService(gpu, StateStore(tmp_path / "agent.db"))


def _limits(gpu: GpuDriver) -> list[int]:
    return [gpu.power_limits(g.uuid).current_mw for g in gpu.gpus()]


def test_apply_sets_each_gpu_and_later_entries_win(gpu: GpuDriver, tmp_path: Path) -> None:
    defaults = [gpu.power_limits(g.uuid).default_mw for g in gpu.gpus()]
    changes = _service(gpu, tmp_path).apply(_SPEC).changes
    want = [300_000] + [round(d * 0.8) for d in defaults[1:]]
    assert _limits(gpu) == want
    assert [(c.index, c.before_mw, c.after_mw) for c in changes] == [
        (i, d, w) for i, (d, w) in enumerate(zip(defaults, want, strict=True))
    ]


def test_a_limit_outside_one_gpus_range_refuses_the_whole_spec(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    before = _limits(gpu)
    with pytest.raises(InvalidSpec) as refused:
        _service(gpu, tmp_path).apply("version: v1\npower:\n  - {gpus: all, limit: 450W}\n")
    assert _limits(gpu) == before  # no GPU changed, not even the H100s 450 W fits
    texts = [v.description for v in refused.value.violations]
    assert {v.field for v in refused.value.violations} == {"power[0].limit"}
    assert texts == [
        f"450W is 450 W on GPU {i} (NVIDIA A100-SXM4-80GB), outside its range 100-400 W "
        "(default 400 W)"
        for i in range(4)
    ]


def test_selectors_that_find_nothing_are_refused(gpu: GpuDriver, tmp_path: Path) -> None:
    service = _service(gpu, tmp_path)
    for text, says in [
        ("version: v1\npower: [{gpus: [99], limit: 0.9}]\n", "GPU 99 does not exist"),
        ("version: v1\npower: [{gpus: [GPU-nope], limit: 0.9}]\n", "no GPU of this node is"),
        ("version: v1\npower: [{model: B200, limit: 0.9}]\n", "no GPU of this node is 'B200'"),
    ]:
        with pytest.raises(InvalidSpec, match=says):
            service.apply(text)
    assert service.show().spec_text == ""


def test_model_matches_the_nvml_name_with_or_without_nvidia(gpu: GpuDriver, tmp_path: Path) -> None:
    service = _service(gpu, tmp_path)
    service.apply("version: v1\npower: [{model: '  h100 80GB  HBM3 ', limit: 600W}]\n")
    view = service.show()
    assert {g.name for g in view.gpus if g.uuid in view.desired_mw} == {"NVIDIA H100 80GB HBM3"}
    assert list(view.desired_mw.values()) == [600_000] * 4


def test_restore_returns_the_limits_from_before_the_first_apply(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    service = _service(gpu, tmp_path)
    first = gpu.gpus()[0].uuid
    gpu.set_power_limit(first, 350_000)  # an operator's nvidia-smi -pl before the agent
    before = _limits(gpu)
    service.apply(_SPEC)
    service.apply("version: v1\npower: [{gpus: all, limit: 0.9}]\n")  # baselines stay the first
    changes = service.restore().changes
    assert _limits(gpu) == before
    assert {c.after_mw for c in changes if c.uuid == first} == {350_000}
    view = service.show()
    assert (view.spec_text, view.desired_mw, view.baseline_mw) == ("", {}, {})
    assert service.reconcile() == []  # nothing re-caps after a restore


def test_a_gpu_lost_at_restore_keeps_its_baseline_until_it_answers(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """A restore forgot every baseline, a lost GPU's too: it never got its limit back. Its
    baseline stays, and the check that re-caps puts it back once the GPU answers."""
    service = _service(gpu, tmp_path)
    first = gpu.gpus()[0]
    gpu.set_power_limit(first.uuid, 350_000)  # an operator's nvidia-smi -pl before the agent
    service.apply(_SPEC)
    SimControl(tmp_path).mark_lost(first.index)
    restored = service.restore()
    changes = restored.changes
    assert first.uuid not in {c.uuid for c in changes} and changes  # the others are back
    assert restored.lost == [LostTarget(first.index, first.uuid)]  # the answer says it is owed
    assert service.show().baseline_mw == {first.uuid: 350_000}
    assert service.reconcile() == []  # still lost: nothing to do, nothing forgotten
    SimControl(tmp_path).reboot()  # it answers again (at its default limit)
    (back,) = service.reconcile()
    assert (back.uuid, back.after_mw) == (first.uuid, 350_000)
    assert gpu.power_limits(first.uuid).current_mw == 350_000
    assert service.show().baseline_mw == {} and service.reconcile() == []


def test_an_apply_killed_before_its_spec_was_recorded_is_undone_at_the_next_check(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """The agent died after journalling a baseline and capping a GPU, before the spec was
    written: no spec is in force, so the GPU goes back to its baseline, not capped for good."""
    store = StateStore(tmp_path / "agent.db")
    first = gpu.gpus()[0]
    before = gpu.power_limits(first.uuid).current_mw
    store.journal_append(BASELINE, {"uuid": first.uuid, "limit_mw": before})
    gpu.set_power_limit(first.uuid, before - 50_000)  # the cap the killed apply had set
    restarted = PowerService(gpu, store)
    (undone,) = restarted.reconcile()
    assert (undone.uuid, undone.after_mw) == (first.uuid, before)
    assert restarted.show().baseline_mw == {} and restarted.reconcile() == []


def test_a_new_service_reapplies_after_a_reboot(gpu: GpuDriver, tmp_path: Path) -> None:
    _service(gpu, tmp_path).apply(_SPEC)
    want = _limits(gpu)
    SimControl(tmp_path).reboot()
    assert _limits(gpu) != want
    restarted = _service(gpu, tmp_path)  # the agent restarted: only the journal is left
    assert len(restarted.reconcile()) == len(want)
    assert _limits(gpu) == want
    assert restarted.reconcile() == []


def test_a_refused_set_puts_back_the_gpus_already_changed(gpu: GpuDriver, tmp_path: Path) -> None:
    service = _service(gpu, tmp_path)
    before = _limits(gpu)
    SimControl(tmp_path).inject_fault("nvmlDeviceSetPowerManagementLimit", "NoPermission", nth=3)
    with pytest.raises(PermissionDenied):
        service.apply(_SPEC)
    assert _limits(gpu) == before
    assert service.show().spec_text == ""  # not the desired state: nothing to re-apply


def test_a_refused_apply_leaves_no_baseline_to_undo_a_limit_set_by_hand_later(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """A set NVML refused put the GPUs back and recorded no spec, but kept the baselines it had
    journalled: `power show` said "RESTORES TO 400 W" with no spec applied, and the next check
    (the running agent's, or the attach of the next command's agent) took them for an
    unfinished restore and put them back, undoing a limit the admin then set by hand."""
    service = _service(gpu, tmp_path)
    SimControl(tmp_path).inject_fault("nvmlDeviceSetPowerManagementLimit", "NoPermission", nth=3)
    with pytest.raises(PermissionDenied):
        service.apply(_SPEC)
    assert service.show().baseline_mw == {}
    by_hand = gpu.gpus()[0]
    limits = gpu.power_limits(by_hand.uuid)
    gpu.set_power_limit(by_hand.uuid, limits.current_mw - 50_000)  # nvidia-smi -pl
    assert service.reconcile() == []
    assert gpu.power_limits(by_hand.uuid).current_mw == limits.current_mw - 50_000


def test_a_gpu_without_power_management_refuses_the_apply(gpu: GpuDriver, tmp_path: Path) -> None:
    before = _limits(gpu)
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported", gpu=1
    )
    with pytest.raises(NotSupported):
        _service(gpu, tmp_path).apply(_SPEC)
    assert _limits(gpu) == before


def test_reconcile_logs_a_lasting_refusal_once_and_sets_the_others(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # whatever an earlier test in this worker left the "agent" logger's level at
    caplog.set_level(logging.WARNING, logger="agent.power.service")
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    want = _limits(gpu)
    SimControl(tmp_path).reboot()
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceSetPowerManagementLimit", "NoPermission", gpu=0, count=2
    )
    assert [c.index for c in service.reconcile()] == list(range(1, len(want)))
    service.reconcile()
    refusals = [r for r in caplog.records if "not re-applied" in r.getMessage()]
    assert len(refusals) == 1 and "GPU 0" in refusals[0].getMessage()
    # beyond the one log line, what doctor says while it lasts: the GPU, both limits, why
    [apart] = service.out_of_force()
    assert apart.startswith("GPU 0: 300 W asked, 400 W held (") and "ermission" in apart
    assert [c.index for c in service.reconcile()] == [0]  # the fault is spent
    assert _limits(gpu) == want
    assert service.out_of_force() == []


def test_one_unreadable_gpu_does_not_keep_the_others_uncapped(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    want = _limits(gpu)
    SimControl(tmp_path).reboot()
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported", gpu=1, count=1
    )
    assert [c.index for c in service.reconcile()] == [0, *range(2, len(want))]
    assert [c.index for c in service.reconcile()] == [1]  # readable again: capped too
    assert _limits(gpu) == want


def test_a_gpu_the_new_spec_leaves_out_goes_back_to_its_baseline(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    service = _service(gpu, tmp_path)
    defaults = _limits(gpu)
    service.apply(_SPEC)
    changes = service.apply("version: v1\npower: [{gpus: [0], limit: 300W}]\n").changes
    assert _limits(gpu) == [300_000, *defaults[1:]]
    assert [c.index for c in changes] == list(range(1, len(defaults)))


def test_a_gpu_lost_at_the_apply_is_capped_when_it_answers_and_restored_with_the_others(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """GPU 0 was lost when `gpus: all` was applied; the check capped it once it answered, with
    no baseline journaled, so `power restore` left it capped for good and `power show` had
    nothing to restore it to. Its limit when it is first capped is now its baseline."""
    service = _service(gpu, tmp_path)
    first = gpu.gpus()[0]
    SimControl(tmp_path).mark_lost(first.index)
    applied = service.apply("version: v1\npower:\n  - {gpus: all, limit: 0.8}\n")
    assert applied.lost == [LostTarget(first.index, first.uuid)]
    assert first.uuid not in service.show().baseline_mw
    SimControl(tmp_path).reboot()  # it answers again, at its default limit
    default = gpu.power_limits(first.uuid).current_mw
    capped = {c.uuid: c.after_mw for c in service.reconcile()}  # the reboot reset them all
    assert capped[first.uuid] == int(default * 0.8)
    assert service.show().baseline_mw[first.uuid] == default
    restored = {c.uuid: c.after_mw for c in service.restore().changes}
    assert restored[first.uuid] == default == gpu.power_limits(first.uuid).current_mw
    assert service.show().baseline_mw == {}


def test_a_spec_naming_a_lost_gpu_is_refused_as_lost_and_a_stored_one_shows_the_rest(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`gpus: [0]` with GPU 0 lost said "GPU 0 does not exist; the node has GPUs 1, ..." (exit
    2, a spec error). It is DeviceLost now (exit 7), naming it lost, and nothing is changed. A
    stored spec that names it hid the whole spec from `power show`; the rest is shown."""
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    want = _limits(gpu)
    first = gpu.gpus()[0]
    SimControl(tmp_path).mark_lost(first.index)
    with pytest.raises(DeviceLost) as refused:
        service.apply("version: v1\npower:\n  - {gpus: [0], limit: 400W}\n")
    assert "power[0].gpus: GPU 0 is lost (it does not answer)" in str(refused.value)
    assert _limits(gpu) == want[1:]  # the GPUs that answer, unchanged
    with caplog.at_level(logging.WARNING, logger="agent.power.service"):
        view = service.show()
    assert {g.index for g in view.gpus} == set(range(1, len(want)))
    assert [view.desired_mw[g.uuid] for g in view.gpus] == want[1:]
    assert "power[1].gpus: GPU 0 is lost" in caplog.text
    with pytest.raises(InvalidSpec):  # with another problem beside it: a spec error
        service.apply("version: v1\npower:\n  - {gpus: [0, 99], limit: 400W}\n")


def test_show_leaves_out_only_a_gpu_whose_limits_cannot_be_read(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """One GPU without power management made `power show` fail (exit 6) and show no GPU."""
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported", gpu=1, count=1000
    )
    view = service.show()
    assert [g.index for g in view.gpus] == [0, *range(2, len(gpu.gpus()))]
    assert view.spec_text and len(view.desired_mw) == len(gpu.gpus()) - 1


def test_a_restore_refused_by_an_unreadable_gpu_keeps_the_spec_in_force(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """The restore failed (exit 6) after it had forgotten the spec, so the next check put the
    limits back anyway: an error that changed everything. Now it changes nothing."""
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    capped = _limits(gpu)
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported", gpu=1
    )
    with pytest.raises(NotSupported):
        service.restore()
    assert service.show().spec_text  # still in force
    assert service.reconcile() == [] and _limits(gpu) == capped


def test_a_refused_apply_keeps_the_baseline_of_a_gpu_lost_before_it_was_put_back(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """GPU 0's limit was set, GPU 2's set was refused, and GPU 0 fell off the bus before it was
    put back. Its baseline was dropped with the others' (a GPU not read counted as back at
    it), so `restore` could never put its limit back once it answers again."""
    service = _service(gpu, tmp_path)
    first = gpu.gpus()[0].uuid
    real = gpu.set_power_limit
    calls: list[str] = []

    def set_limit(uuid: str, milliwatts: int) -> None:
        calls.append(uuid)
        if len(calls) == 3:
            raise PermissionDenied("refused")
        if len(calls) > 3 and uuid == first:
            SimControl(tmp_path).mark_lost(0)  # gone before its put-back
        real(uuid, milliwatts)

    gpu.set_power_limit = set_limit  # type: ignore[method-assign]
    with pytest.raises(PermissionDenied):
        service.apply(_SPEC)
    assert first in service.show().baseline_mw


def test_a_limit_another_writer_replaces_is_reported_as_the_driver_holds_it(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NVML takes GPU 1's set, then another writer on the host (a site power manager) sets
    250 W: the change says 250 W is held and 320 W was asked, and the log names the GPU and
    both; the GPUs nobody else writes hold exactly what was set."""
    caplog.set_level(logging.WARNING, logger="agent.power.service")
    SimControl(tmp_path).write_power_limit(1, 250)
    changes = {c.index: c for c in _service(gpu, tmp_path).apply(_SPEC).changes}
    assert (changes[1].requested_mw, changes[1].after_mw, changes[1].held) == (
        320_000,
        250_000,
        False,
    )
    assert _limits(gpu)[1] == 250_000
    assert all(c.held and c.after_mw == _limits(gpu)[i] for i, c in changes.items() if i != 1)
    (said,) = [r.getMessage() for r in caplog.records if "driver holds" in r.getMessage()]
    assert "GPU 1" in said and "320 W" in said and "250 W" in said


def test_a_set_whose_read_back_fails_is_put_back_with_the_others(
    gpu: GpuDriver, tmp_path: Path
) -> None:
    """GPU 1's set went through but its limit cannot be read back: the apply fails, and GPU 1
    is put back as well as GPU 0, not left capped with no spec and no record."""
    before = _limits(gpu)
    # the apply's first read of GPU 1 passes; the read-back after its set fails
    SimControl(tmp_path).inject_fault("nvmlDeviceGetPowerManagementLimit", "Unknown", nth=2, gpu=1)
    with pytest.raises(AgentError):
        _service(gpu, tmp_path).apply(_SPEC)
    assert _limits(gpu) == before


def test_a_gpu_that_fails_a_read_is_left_out_and_a_spec_naming_it_is_refused_naming_it(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPU 1's MIG mode read failing (UNKNOWN, as a GPU that needs a reset answers) failed
    every power read: GPU 0's cap was not put back, `power show` said only the call."""
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    want = _limits(gpu)
    SimControl(tmp_path).reboot()  # the driver forgot every cap
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    with caplog.at_level(logging.WARNING, logger="agent.power.service"):
        assert [c.index for c in service.reconcile()] == [0, *range(2, len(want))]
    assert "GPU 1 cannot be read, left out of the power caps until it is: nvmlDeviceGetMigMode" in (
        caplog.text
    )
    assert [g.index for g in service.show().gpus] == [0, *range(2, len(want))]
    with pytest.raises(AgentError) as refused:
        service.apply("version: v1\npower:\n  - {gpus: [1], limit: 300W}\n")
    assert not isinstance(refused.value, InvalidSpec)  # the spec is right; the GPU's read failed
    assert "power[0].gpus: GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error)" in str(
        refused.value
    )
    SimControl(tmp_path).clear_faults()
    assert [c.index for c in service.reconcile()] == [1]  # read again: capped too
    assert _limits(gpu) == want


def test_a_gpu_unread_at_the_apply_is_said_capped_once_read_not_re_applied(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPU 1 unread at the apply (left out, never capped), then read again: the check caps it,
    and said "re-applied ... (the driver had lost it: a reboot, a driver reload, or another
    tool changed it)" of a cap never applied. Its first cap is said as one."""
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    service = _service(gpu, tmp_path)
    before = gpu.power_limits(gpu.gpus()[1].uuid).current_mw
    assert 1 not in [c.index for c in service.apply(_SPEC).changes]
    SimControl(tmp_path).clear_faults()
    with caplog.at_level(logging.WARNING, logger="agent.power.service"):
        (change,) = service.reconcile()
    assert change.index == 1 and change.before_mw == before
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("power cap")]
    watts = f"{before / 1000:g} W -> {change.after_mw / 1000:g} W"
    assert said == [f"power cap applied on GPU 1, read again: {watts}"]
    SimControl(tmp_path).reboot()  # the driver forgets every cap: GPU 1's is re-applied now
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent.power.service"):
        service.reconcile()
    assert f"power cap re-applied on GPU 1: {watts} (the driver had lost it" in caplog.text


def test_a_first_cap_that_failed_once_is_still_said_as_a_first_cap(
    gpu: GpuDriver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its baseline was recorded before the set, and stayed when the set failed: the next
    check's success said "re-applied (the driver had lost it)" of a cap never applied."""
    control = SimControl(tmp_path)
    control.inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    service = _service(gpu, tmp_path)
    service.apply(_SPEC)
    control.clear_faults()
    control.inject_fault("nvmlDeviceSetPowerManagementLimit", "Unknown", gpu=1, count=1)
    assert service.reconcile() == []  # the first cap refused
    with caplog.at_level(logging.WARNING, logger="agent.power.service"):
        (change,) = service.reconcile()
    assert change.index == 1
    said = [r.getMessage() for r in caplog.records if "applied on GPU 1" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("power cap applied on GPU 1, read again"), said
