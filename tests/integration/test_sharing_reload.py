"""Sharing changes reaching a real process, and surviving SIGKILL mid-write.

A real process stands in for the device plugin (fake_device_plugin.py, started under the name
``nvidia-device-plugin``): the agent finds it by name with psutil, signals it, and the process
re-reads the file and prints what it advertises.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import sharing_pb2, sharing_pb2_grpc
from agent.config import SharingSettings
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import InvalidSpec
from agent.mig.lock import PartitionLock
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import parse_spec
from agent.sharing import parse
from agent.sharing.reload import find_plugin_processes
from agent.sharing.schema import render
from agent.sharing.service import SharingService
from tests.unit.api.support import InProcessAgent, agent_config, unix_channel
from tests.unit.mig.layouts import MIG_HALVES
from tests.unit.mig.simnode import SimNode, sim_node
from tests.unit.sharing.layouts import mig_gpu, node

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FAKE_PLUGIN = Path(__file__).with_name("fake_device_plugin.py")
# The real name with this worker's pid: longer than the kernel's 15-character comm, as the real
# one is, and never another worker's fake plugin (SIGHUP and `share show` find processes by name
# across the machine, so tests in parallel workers would signal and read each other's).
PLUGIN_NAME = f"nvidia-device-plugin-{os.getpid()}"
GPUS = 8


def ts(replicas: int, **section: object) -> dict[str, object]:
    resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
    return {"sharing": {"timeSlicing": {"resources": resources, **section}}}


class PluginProcess:
    """The fake plugin, with its JSON lines read on a thread so tests can wait with a timeout."""

    def __init__(
        self,
        bin_dir: Path,
        config: Path,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        exe = bin_dir / PLUGIN_NAME
        if not exe.exists():
            exe.symlink_to(sys.executable)
        # The link is not inside the venv, so give the interpreter the venv's packages (PyYAML).
        environ = {k: v for k, v in os.environ.items() if k != "MIG_STRATEGY"}
        environ.update(env or {}, PYTHONPATH=sysconfig.get_paths()["purelib"])
        self.proc = subprocess.Popen(
            [str(exe), str(FAKE_PLUGIN), "--config-file", str(config), "--gpus", str(GPUS), *args],
            stdout=subprocess.PIPE,
            text=True,
            env=environ,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next_event(self, timeout: float = 20.0) -> dict[str, object]:
        event = json.loads(self.lines.get(timeout=timeout))
        assert isinstance(event, dict)
        return event

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    d = tmp_path / "plugin-config"
    d.mkdir()
    return d / "config.yaml"


@pytest.fixture
def plugin(tmp_path: Path, config_path: Path) -> Iterator[PluginProcess]:
    p = PluginProcess(tmp_path, config_path)
    try:
        yield p
    finally:
        p.stop()


def service(config_path: Path, clock: Callable[[], float] = time.time) -> SharingService:
    settings = SharingSettings(
        config_path=config_path, reload="sighup", plugin_process_name=PLUGIN_NAME
    )
    return SharingService(settings, lambda: node(GPUS), clock=clock)


def test_the_fake_plugin_is_found_by_a_name_longer_than_the_kernels_comm(
    plugin: PluginProcess,
) -> None:
    """As the real "nvidia-device-plugin" (20 characters) is: the kernel keeps 15."""
    plugin.next_event()
    assert plugin.proc.pid in [p.pid for p in find_plugin_processes(PLUGIN_NAME)]


def test_sighup_makes_the_running_plugin_load_the_new_config(
    plugin: PluginProcess, config_path: Path
) -> None:
    """set -> file written -> SIGHUP to the process found by name -> it advertises 8 x 4."""
    assert plugin.next_event()["advertise"] == {"nvidia.com/gpu": GPUS}
    svc = service(config_path)

    result = svc.set(parse(ts(4)))
    assert result.reload is not None and result.reload.done
    assert plugin.proc.pid in result.reload.pids
    event = plugin.next_event()
    assert event == {
        "event": "loaded",
        "pid": plugin.proc.pid,
        "advertise": {"nvidia.com/gpu": 32},
        "mig_strategy": "none",
    }
    # What the agent says the plugin advertises is what the plugin says.
    assert {a.resource: a.count for a in result.advertised} == event["advertise"]
    view = svc.show()
    assert view.pickup.state == "signalled"
    assert f"pid {plugin.proc.pid} was sent SIGHUP" in view.pickup.detail

    svc.set(parse(ts(2, renameByDefault=True)))
    assert plugin.next_event()["advertise"] == {"nvidia.com/gpu.shared": 16}

    svc.rollback()
    assert plugin.next_event()["advertise"] == {"nvidia.com/gpu": 32}
    svc.clear()
    assert plugin.next_event()["advertise"] == {"nvidia.com/gpu": GPUS}


def test_a_plugin_started_after_the_write_is_reported_as_loaded(
    tmp_path: Path, config_path: Path
) -> None:
    # Process start times are only good to a second: the write is dated 5 s back rather than
    # waiting for the clock to move on.
    svc = service(config_path, clock=lambda: time.time() - 5)
    result = svc.set(parse(ts(3)))
    assert result.reload is not None and not result.reload.done  # nothing to signal yet
    assert svc.show().pickup.state == "not-loaded"
    p = PluginProcess(tmp_path, config_path)
    try:
        assert p.next_event()["advertise"] == {"nvidia.com/gpu": 24}
        view = svc.show()
        assert view.pickup.state == "loaded"
        assert str(p.proc.pid) in view.pickup.detail
    finally:
        p.stop()


# The writer in a child process, paused by the chunk hook once half of a large config is on disk.
_PAUSED_WRITER = """
import sys, time
from pathlib import Path
from agent.sharing.schema import parse, render
from agent.sharing.store import atomic_write

path = Path(sys.argv[1])
config = render(parse({"sharing": {"timeSlicing": {"resources": [
    {"name": "nvidia.com/gpu", "replicas": 8}]}}}))
data = (config + "# padding\\n" * 3_000_000).encode()

def pause(written: int) -> None:
    if written >= len(data) // 2:
        print("paused", written, len(data), flush=True)
        time.sleep(600)

atomic_write(path, data, chunk_size=1 << 20, on_chunk=pause)
"""


def test_sigkill_during_a_write_never_leaves_a_partial_config(config_path: Path) -> None:
    """The plugin's file is whole-old until the rename: a killed writer leaves only a temp file,
    which the next change removes."""
    svc = service(config_path)
    svc.set(parse(ts(4)))
    old = config_path.read_bytes()

    writer = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_WRITER, str(config_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert writer.stdout is not None
    _, written, total = writer.stdout.readline().split()
    temp_files = list(config_path.parent.glob(".config.yaml.*.tmp"))
    assert len(temp_files) == 1
    assert int(written) <= temp_files[0].stat().st_size < int(total)
    assert config_path.read_bytes() == old

    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=10) == -signal.SIGKILL
    assert config_path.read_bytes() == old
    assert parse(config_path.read_bytes()) == parse(ts(4))

    svc.set(parse(ts(2)))
    assert parse(config_path.read_bytes()) == parse(ts(2))
    assert list(config_path.parent.glob(".config.yaml.*.tmp")) == []


_LOOPING_WRITER = """
import sys
from pathlib import Path
from agent.sharing.store import atomic_write

path, a, b = Path(sys.argv[1]), Path(sys.argv[2]).read_bytes(), Path(sys.argv[3]).read_bytes()
print("started", flush=True)
while True:
    atomic_write(path, a, chunk_size=1 << 16)
    atomic_write(path, b, chunk_size=1 << 16)
"""


def test_sigkill_at_arbitrary_moments_leaves_one_whole_version(
    tmp_path: Path, config_path: Path
) -> None:
    """Kill a writer that alternates two large configs at random points: the file is always
    exactly one of them."""
    versions = []
    for i, replicas in enumerate((3, 5)):
        data = (render(parse(ts(replicas))) + f"# version {i}\n" * 200_000).encode()
        (tmp_path / f"v{i}").write_bytes(data)
        versions.append(data)
    config_path.write_bytes(versions[0])
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _LOOPING_WRITER,
                str(config_path),
                *(str(tmp_path / f"v{i}") for i in (0, 1)),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert writer.stdout is not None and writer.stdout.readline() == "started\n"
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        assert config_path.read_bytes() in versions


def test_the_plugin_s_own_mig_strategy_is_the_one_shown_and_a_write_it_would_ignore_is_refused(
    tmp_path: Path, config_path: Path
) -> None:
    """The GPU Operator starts the plugin with MIG_STRATEGY; the plugin then ignores the file's
    flags.migStrategy (api/config/v1 flags.go). The agent reads the running plugin's own setting
    from /proc, says the file's is overridden, and refuses to write one it would ignore."""
    layouts = [mig_gpu(i, "1g.10gb", "1g.10gb", "3g.40gb") for i in range(2)]
    settings = SharingSettings(
        config_path=config_path, reload="sighup", plugin_process_name=PLUGIN_NAME
    )
    svc = SharingService(settings, lambda: layouts)
    config_path.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    # written well before the plugin starts: it has loaded it (what it advertises is known)
    os.utime(config_path, (time.time() - 60, time.time() - 60))
    p = PluginProcess(tmp_path, config_path, env={"MIG_STRATEGY": "none", "NGC_API_KEY": "s3cr3t"})
    try:
        assert p.next_event()["mig_strategy"] == "none"  # what the plugin itself runs with
        view = svc.show()
        assert {v.field for v in view.problems} == {"flags.migStrategy"}
        problems = " ".join(v.description for v in view.problems)
        assert "MIG_STRATEGY environment variable overrides the file's mixed" in problems
        assert "MIG is enabled on GPU(s) 0, 1 but migStrategy is none" in problems
        assert "s3cr3t" not in problems
        # Advertised as the plugin runs, under none: two whole GPUs, no MIG resource.
        assert {a.resource: a.count for a in view.advertised} == {"nvidia.com/gpu": 2}
        with pytest.raises(InvalidSpec, match="would be ignored"):
            svc.set(parse({"flags": {"migStrategy": "single"}}))
        assert config_path.read_text() == "version: v1\nflags:\n  migStrategy: mixed\n"
    finally:
        p.stop()
    q = PluginProcess(
        tmp_path, config_path, "--mig-strategy", "mixed", env={"MIG_STRATEGY": "none"}
    )
    try:
        assert q.next_event()["mig_strategy"] == "mixed"  # the flag wins over the environment
        view = svc.show()
        assert not view.problems
        assert {a.resource for a in view.advertised} == {
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-3g.40gb",
        }
    finally:
        q.stop()


def _mig_node(tmp_path: Path, mode: AllocationMode, tell: Callable[[], str]) -> SimNode:
    node = sim_node(tmp_path / "node", "dgx-h100")
    node.service = MigService(
        node.driver,
        node.store,
        PartitionLock(node.state_dir),
        simulated_reset(node.state_dir),
        allocation=lambda: Allocation(mode, "test"),
        tell_plugin=tell,
    )
    return node


def test_a_mig_change_makes_the_running_plugin_reload_and_an_unchanged_apply_does_not(
    plugin: PluginProcess, config_path: Path, tmp_path: Path
) -> None:
    """The device plugin enumerates MIG devices only when its plugins start (k8s-device-plugin
    #992); after an apply that changed a GPU the agent sends it SIGHUP, which restarts them,
    and says so in the apply's result. An apply that changes nothing sends nothing. What the
    plugin then advertises is not checked here: the plugin stand-in (fake_device_plugin.py)
    models full GPUs only, so the test holds the agent to the signal and the reload it causes."""
    plugin.next_event()
    svc = service(config_path)
    node = _mig_node(tmp_path, AllocationMode.DEVICE_PLUGIN, svc.reload_for_mig_change)
    try:
        spec = parse_spec(MIG_HALVES)
        result = node.service.apply(spec, "halves")
        assert result.device_plugin == f"sent SIGHUP to {PLUGIN_NAME} pid {plugin.proc.pid}"
        assert plugin.next_event()["event"] == "loaded"  # the plugin started over
        again = node.service.apply(spec, "halves")
        assert again.mutations == 0 and again.device_plugin == ""
        assert plugin.lines.empty()
    finally:
        node.close()


def test_no_plugin_to_tell_is_said_and_the_layout_stays_applied(
    config_path: Path, tmp_path: Path
) -> None:
    svc = service(config_path)
    node = _mig_node(tmp_path, AllocationMode.DEVICE_PLUGIN, svc.reload_for_mig_change)
    try:
        result = node.service.apply(parse_spec(MIG_HALVES), "halves")
        assert result.device_plugin.startswith(f"not reloaded: no process named {PLUGIN_NAME}")
        assert [g.status for g in result.gpus] == ["applied"]
    finally:
        node.close()
    # Where no device plugin serves the node (mode none: a laptop, the simulator), nothing is
    # told and nothing said.
    quiet = _mig_node(tmp_path / "quiet", AllocationMode.NONE, svc.reload_for_mig_change)
    try:
        assert quiet.service.apply(parse_spec(MIG_HALVES), "halves").device_plugin == ""
    finally:
        quiet.close()


def test_a_rollback_is_checked_against_the_strategy_the_plugin_runs_with(
    tmp_path: Path, config_path: Path
) -> None:
    """``share set`` checked a config as the plugin runs it (its own MIG_STRATEGY laid over
    the file's), ``share rollback`` only against the file: with the plugin started with
    MIG_STRATEGY=mixed, rolling back to MPS (which that plugin refuses to start with) was
    written and signalled. Rollback now refuses what set refuses, and writes nothing
    (docs/sharing.md, top: the plugin's own migStrategy)."""
    settings = SharingSettings(
        config_path=config_path, reload="none", plugin_process_name=PLUGIN_NAME
    )
    svc = SharingService(settings, lambda: node(GPUS))
    mps = parse({"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}})
    svc.set(mps)
    svc.set(parse(ts(4)))  # the MPS config is now the previous one
    files = {f.name: f.read_bytes() for f in config_path.parent.iterdir()}
    p = PluginProcess(tmp_path, config_path, env={"MIG_STRATEGY": "mixed"})
    try:
        assert p.next_event()["mig_strategy"] == "mixed"
        with pytest.raises(InvalidSpec) as refused_set:
            svc.set(mps)
        with pytest.raises(InvalidSpec, match="cannot roll back") as refused:
            svc.rollback()
        assert {v.field for v in refused.value.violations} == {
            v.field for v in refused_set.value.violations
        }
        assert {f.name: f.read_bytes() for f in config_path.parent.iterdir()} == files
    finally:
        p.stop()


def test_a_reader_is_not_shown_the_plugin_s_pids(tmp_path: Path, config_path: Path) -> None:
    """docs/security.md: a read identity sees no process. GetSharing tells a reader that the
    plugin was signalled and loaded the file, not its pids; the node's admin (the Unix socket)
    reads them."""
    root = tmp_path / "agent"
    sharing = {"config_path": str(config_path), "reload": "sighup"}
    config = agent_config(
        root,
        sharing={**sharing, "plugin_process_name": PLUGIN_NAME},
        grpc_insecure_listen="127.0.0.1:0",  # the loopback door: the read role
    )
    p = PluginProcess(tmp_path, config_path)
    try:
        p.next_event()
        with (
            InProcessAgent(root, config) as agent,
            unix_channel(agent.socket) as admin,
            grpc.insecure_channel(f"127.0.0.1:{agent.node.ports.insecure}") as reader,
        ):
            request = sharing_pb2.SetSharingRequest(config_yaml=render(parse(ts(4))))
            sharing_pb2_grpc.SharingServiceStub(admin).SetSharing(request, timeout=20)
            p.next_event()
            pid = str(p.proc.pid)
            get = sharing_pb2.GetSharingRequest()
            mine = sharing_pb2_grpc.SharingServiceStub(admin).GetSharing(get, timeout=10)
            assert mine.plugin_state == "signalled" and pid in mine.plugin_detail
            assert list(mine.last_write.reload.pids) == [p.proc.pid]

            theirs = sharing_pb2_grpc.SharingServiceStub(reader).GetSharing(get, timeout=10)
            assert theirs.plugin_state == "signalled" and theirs.last_write.reload.done
            assert not theirs.last_write.reload.pids
            assert pid not in theirs.plugin_detail + theirs.last_write.reload.detail
            assert "pid (withheld) was sent SIGHUP" in theirs.plugin_detail
    finally:
        p.stop()


def test_the_sharing_role_is_not_told_the_pids_it_signalled(
    tmp_path: Path, config_path: Path
) -> None:
    """docs/security.md: pids are for the mig and admin roles. SetSharing's answer to the
    sharing role named the device plugin's host pids in its reload (`pids`, and the detail
    "sent SIGHUP to ... pid N"), while GetSharing withholds them from that role."""
    from tests.unit.api.support import COORDINATOR, Pki

    sharer_uri = "spiffe://cluster/ns/gpu-system/sa/sharing"
    pki = Pki(tmp_path / "pki")
    sharer = pki.issue("sharer", f"URI:{sharer_uri}")
    root = tmp_path / "agent"
    sharing = {"config_path": str(config_path), "reload": "sighup"}
    config = agent_config(
        root,
        pki,
        roles={"admin": [COORDINATOR], "sharing": [sharer_uri]},
        sharing={**sharing, "plugin_process_name": PLUGIN_NAME},
    )
    p = PluginProcess(tmp_path, config_path)
    try:
        p.next_event()
        with (
            InProcessAgent(root, config) as agent,
            grpc.secure_channel(
                f"localhost:{agent.node.ports.tcp}", sharer.credentials(pki.ca)
            ) as channel,
        ):
            request = sharing_pb2.SetSharingRequest(config_yaml=render(parse(ts(4))))
            answer = sharing_pb2_grpc.SharingServiceStub(channel).SetSharing(request, timeout=20)
            p.next_event()
        reload = answer.change.reload
        assert reload.done and reload.method == "sighup", reload
        assert not reload.pids and str(p.proc.pid) not in reload.detail, reload
    finally:
        p.stop()


def test_a_rollback_to_the_config_on_disk_reloads_a_plugin_that_has_not_loaded_it(
    tmp_path: Path, config_path: Path
) -> None:
    """RollbackSharing to what the file already says (its previous is the same: a writer
    stopped between the two files) answered "unchanged" and reloaded nothing, while the running
    plugin had never loaded the file: it kept its old config. Now it is signalled, as a set of
    the same config does, and the answer says so."""
    p = PluginProcess(tmp_path, config_path)
    try:
        assert p.next_event()["advertise"] == {"nvidia.com/gpu": GPUS}
        # Written with no reload (dated 5 s on: start times are good to a second), so the
        # plugin, older than the write and not signalled, has not loaded it.
        unreloaded = SharingSettings(
            config_path=config_path, reload="none", plugin_process_name=PLUGIN_NAME
        )
        SharingService(unreloaded, lambda: node(GPUS), clock=lambda: time.time() + 5).set(
            parse(ts(4))
        )
        written = config_path.read_bytes()
        config_path.with_name("config.yaml.previous").write_bytes(written)
        root = tmp_path / "agent"
        sharing = {"config_path": str(config_path), "reload": "sighup"}
        config = agent_config(root, sharing={**sharing, "plugin_process_name": PLUGIN_NAME})
        with InProcessAgent(root, config) as agent, unix_channel(agent.socket) as admin:
            stub = sharing_pb2_grpc.SharingServiceStub(admin)
            get = sharing_pb2.GetSharingRequest()
            assert stub.GetSharing(get, timeout=10).plugin_state == "not-loaded"
            answer = stub.RollbackSharing(sharing_pb2.RollbackSharingRequest(), timeout=20)
            assert not answer.change.changed and config_path.read_bytes() == written
            reload = answer.change.reload
            assert reload.done and list(reload.pids) == [p.proc.pid], reload
            assert p.next_event()["advertise"] == {"nvidia.com/gpu": GPUS * 4}
            assert stub.GetSharing(get, timeout=10).plugin_state == "signalled"
    finally:
        p.stop()
