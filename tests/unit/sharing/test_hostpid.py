"""An agent without hostPID is in a PID namespace of its own (``/proc/self/ns/pid`` is not the
node's, whose inode the kernel fixes) and cannot see the device plugin's process. Not seen was
read as "not running": the pickup said not-loaded, a false "no", and the coordinator retried the
reload on every pass. It is now not observable, and says why (docs/sharing.md, "Without
hostPID"); through `share`: `tests/unit/sharing/test_cli_share.py`, through the agent, status
and doctor: `tests/integration/test_sharing_no_hostpid.py`."""

from __future__ import annotations

from pathlib import Path

from agent import pidns
from agent.gpu.sim import SimControl, open_simulator
from agent.pidns import NODE_PID_NAMESPACE
from agent.sharing.reload import (
    NO_HOSTPID,
    PluginProcess,
    SighupReloader,
    pickup,
    reload_again,
    unobservable,
)
from agent.sharing.view import Pickup, ReloadReport, StatusRecord
from tests.unit.sharing.pidns_fixtures import POD_NAMESPACE, a_proc

#: No such process runs here.
PLUGIN = "gpu-agent-test-no-such-plugin"


def test_the_agent_s_pid_namespace_is_read_from_its_ns_link(tmp_path: Path) -> None:
    assert pidns.hides(a_proc(tmp_path / "pod", POD_NAMESPACE, nspid="7"))
    assert not pidns.hides(a_proc(tmp_path / "host", NODE_PID_NAMESPACE, nspid="48213"))
    # A container's own /proc lists one pid in NSpid (the namespaces from /proc's down), so
    # NSpid is read only without the link: more than one pid is a child namespace.
    assert pidns.hides(a_proc(tmp_path / "nested", None, nspid="48213\t7"))
    assert not pidns.hides(a_proc(tmp_path / "one", None, nspid="48213"))
    # Not said (no link, no NSpid before Linux 4.1, no /proc): not claimed hidden, as before,
    # nor claimed to show the node's processes (prewarm's in-use scan then rules out no one).
    assert pidns.namespace(a_proc(tmp_path / "old", None)) == ""
    assert not pidns.hides(tmp_path / "none")
    assert not pidns.sees_node(tmp_path / "old") and not pidns.sees_node(tmp_path / "one")
    assert pidns.sees_node(tmp_path / "host") and not pidns.sees_node(tmp_path / "pod")


def test_a_simulated_node_s_agent_sees_the_node_s_processes_after_a_reboot_too(
    tmp_path: Path,
) -> None:
    open_simulator(tmp_path, "dgx-h100")
    control = SimControl(tmp_path)
    assert pidns.sees_node(control.proc_root)
    control.reboot()
    assert pidns.sees_node(control.proc_root)


def judge(processes: list[PluginProcess], hidden: bool) -> Pickup:
    status = StatusRecord("set", "s", 100.0, ReloadReport("sighup", False, "none seen", 100.0))
    return pickup(
        file_sha256="s",
        file_mtime=100.0,
        status=status,
        processes=processes,
        process_name="nvidia-device-plugin",
        hidden=hidden,
    )


def test_an_unseen_plugin_is_not_observable_rather_than_not_loaded() -> None:
    unseen = judge([], hidden=True)
    assert unseen.state == "unknown" and unseen.detail.startswith(NO_HOSTPID)
    assert unobservable(unseen)
    assert judge([], hidden=False).state == "not-loaded"  # hostPID: none runs
    # A plugin that is seen all the same (it shares the namespace) is judged as ever.
    assert judge([PluginProcess(42, 200.0)], hidden=True).state == "loaded"


def test_a_reload_is_repeated_for_an_unseen_plugin_only_while_the_agent_s_did_not_reach_it() -> (
    None
):
    """Again by a label or a pod restart, which need no sight of the plugin; never by a
    signal, which cannot reach a process the agent does not see."""
    unseen = Pickup("unknown", f"{NO_HOSTPID}: (test)")

    def record(sha: str, reload: ReloadReport | None) -> StatusRecord:
        return StatusRecord("set", sha, 100.0, reload)

    missed = ReloadReport("label", False, "label not switched", 100.0)
    reached = ReloadReport("restart-pod", True, "deleted pod p", 100.0)
    assert reload_again(unseen, record("s", missed), "s", by_signal=False)
    assert not reload_again(unseen, record("s", missed), "s", by_signal=True)  # cannot reach
    assert reload_again(unseen, record("s", None), "s", by_signal=False)  # the reload failed
    assert not reload_again(unseen, record("s", reached), "s", by_signal=False)  # done once
    assert not reload_again(unseen, record("other", missed), "s", by_signal=False)  # not ours
    assert not reload_again(unseen, None, "s", by_signal=False)
    label_switch = Pickup("unknown", "a label switch (test)")
    assert not reload_again(label_switch, record("s", missed), "s", by_signal=False)
    assert reload_again(Pickup("not-loaded", "(test)"), record("s", reached), "s", by_signal=True)


def test_sighup_says_the_agent_has_no_hostpid(tmp_path: Path) -> None:
    pod = a_proc(tmp_path / "pod", POD_NAMESPACE)
    report = SighupReloader(PLUGIN, lambda: 1000.0, pod).reload()
    assert not report.done and report.detail.startswith(f"{NO_HOSTPID}: no {PLUGIN} to signal")
    host = a_proc(tmp_path / "host", NODE_PID_NAMESPACE)
    assert (
        SighupReloader(PLUGIN, lambda: 1000.0, host)
        .reload()
        .detail.startswith(f"no process named {PLUGIN} found")
    )
