"""Making the device plugin load a new config, and telling whether it did.

Methods (reference/mig.md §5.2): ``sighup`` signals the process named ``nvidia-device-plugin``
(it reloads on SIGHUP; the agent needs hostPID to see it); ``label`` sets the node label
``nvidia.com/device-plugin.config`` so the plugin's config-manager switches to the named config
and signals it; ``restart-pod`` deletes this node's plugin pod so its DaemonSet starts a new one;
``none`` writes the file only. Each reports what it did; none claims more than it saw.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from agent import pidns
from agent.errors import FieldViolation, InvalidSpec, PermissionDenied
from agent.kube import KubeClient
from agent.kube_names import is_label_name
from agent.sharing.view import Pickup, ReloadReport, StatusRecord

RELOAD_METHODS = ("sighup", "label", "restart-pod", "none")
CONFIG_LABEL = "nvidia.com/device-plugin.config"

#: Seconds of doubt in a process start time: psutil adds the kernel's boot time, which /proc/stat
#: gives in whole seconds.
START_TIME_RESOLUTION = 1.0

#: Why the plugin's process is not seen, said first in a pickup's detail: psutil lists the
#: agent's own PID namespace, and without hostPID that is its pod's, not the node's.
NO_HOSTPID = "agent has no hostPID; plugin process not visible"

Clock = Callable[[], float]


class Reloader(Protocol):
    def reload(self) -> ReloadReport: ...

    def check(self) -> None:
        """Before a write: refuse what the reload could be told now it will not be allowed to
        do (nothing written yet); a reloader with nothing to ask returns."""
        ...


@dataclass(frozen=True, slots=True)
class PluginProcess:
    pid: int
    started_at: float


def _plugin_processes(name: str) -> list[psutil.Process]:
    # psutil's name() reads the full name from the command line when the kernel's 15-character
    # comm is truncated, as "nvidia-device-plugin" is.
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == name]


def find_plugin_processes(name: str) -> tuple[PluginProcess, ...]:
    """Running processes called ``name``, visible only with hostPID inside a pod."""
    found = []
    for proc in _plugin_processes(name):
        try:
            found.append(PluginProcess(proc.pid, proc.create_time()))
        except psutil.NoSuchProcess:
            continue  # exited since the scan
    return tuple(found)


def unobservable(loaded: Pickup) -> bool:
    """A pickup not known because the plugin's process cannot be seen from here."""
    return loaded.state == "unknown" and loaded.detail.startswith(NO_HOSTPID)


def reload_again(
    loaded: Pickup, status: StatusRecord | None, sha256: str, *, by_signal: bool
) -> bool:
    """Whether a change to what the file (digest ``sha256``) already says reloads the plugin
    again: it is known not to run the file, or its process cannot be seen and the agent's own
    last reload of this file did not reach it, by a way that needs no sight of the process (a
    label, a pod restart: ``by_signal`` False). A signal cannot reach a process not seen; a
    reload that did reach it is not repeated, nor one the agent did not make (a file it did
    not write)."""
    if loaded.state == "not-loaded":
        return True
    if by_signal or not unobservable(loaded) or status is None or status.sha256 != sha256:
        return False
    return status.reload is None or not status.reload.done


class SighupReloader:
    def __init__(
        self, process_name: str, clock: Clock = time.time, proc: Path = Path("/proc")
    ) -> None:
        self._name = process_name
        self._clock = clock
        self._proc = proc

    def check(self) -> None:
        return None  # signalling is tried only with a plugin to signal

    def reload(self) -> ReloadReport:
        signalled = []
        for proc in _plugin_processes(self._name):
            try:
                # psutil checks the pid still belongs to the same process before signalling.
                proc.send_signal(signal.SIGHUP)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied as exc:
                raise PermissionDenied(
                    f"not allowed to signal {self._name} (pid {proc.pid}): the agent needs "
                    "root or CAP_KILL"
                ) from exc
            signalled.append(proc.pid)
        at = self._clock()
        if not signalled:
            why = (
                f"{NO_HOSTPID}: no {self._name} to signal (run the agent with hostPID: true, or "
                "set sharing.reload label or restart-pod)"
                if pidns.hides(self._proc)
                else f"no process named {self._name} found (is the plugin running, and does the "
                "agent run with hostPID: true?)"
            )
            return ReloadReport("sighup", False, f"{why}; it reads the config when it starts", at)
        pids = ", ".join(map(str, signalled))
        return ReloadReport(
            "sighup", True, f"sent SIGHUP to {self._name} pid {pids}", at, tuple(signalled)
        )


class LabelReloader:
    def __init__(
        self, kube: KubeClient, node: str, config_name: str, clock: Clock = time.time
    ) -> None:
        self._kube = kube
        self._node = node
        self._config_name = config_name
        self._clock = clock

    def check(self) -> None:
        return None  # the node's labels: granted by the agent's own role

    def reload(self) -> ReloadReport:
        before = self._kube.node_labels(self._node).get(CONFIG_LABEL)
        if before == self._config_name:
            # config-manager acts on a *change* of the label only.
            return ReloadReport(
                "label",
                False,
                f"{CONFIG_LABEL} is already {self._config_name!r} on node {self._node}; "
                "config-manager reloads only when the label changes, so the plugin was not "
                "reloaded (use reload sighup or restart-pod for edits in place)",
                self._clock(),
            )
        self._kube.patch_node_labels(self._node, {CONFIG_LABEL: self._config_name})
        was = f"was {before!r}" if before is not None else "was unset"
        return ReloadReport(
            "label",
            True,
            f"set {CONFIG_LABEL}={self._config_name} on node {self._node} ({was}); "
            "config-manager switches the plugin to it",
            self._clock(),
        )


class RestartPodReloader:
    def __init__(
        self, kube: KubeClient, node: str, namespace: str, selector: str, clock: Clock = time.time
    ) -> None:
        self._kube = kube
        self._node = node
        self._namespace = namespace
        self._selector = selector
        self._clock = clock

    def check(self) -> None:
        """A dry-run delete of this node's plugin pods: the API server authorizes it as a real
        one, so a Role that is missing refuses the change before the file is written."""
        try:
            self._kube.delete_pods(self._namespace, self._selector, self._node, dry_run=True)
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"reload restart-pod would fail (namespace {self._namespace}): {exc}; nothing "
                "was written"
            ) from exc

    def reload(self) -> ReloadReport:
        deleted = self._kube.delete_pods(self._namespace, self._selector, self._node)
        at = self._clock()
        where = f"{self._selector} in namespace {self._namespace} on node {self._node}"
        if not deleted:
            return ReloadReport("restart-pod", False, f"no pod matching {where}", at)
        return ReloadReport(
            "restart-pod",
            True,
            f"deleted pod {', '.join(deleted)} ({where}); its DaemonSet starts a new one, "
            "which reads the config at start-up",
            at,
        )


class NoReload:
    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock

    def check(self) -> None:
        return None

    def reload(self) -> ReloadReport:
        return ReloadReport(
            "none",
            False,
            "reload is off: the plugin reads the config when it next starts",
            self._clock(),
        )


def make_reloader(
    method: str,
    *,
    process_name: str,
    label_config_name: str,
    namespace: str,
    label_selector: str,
    kube: KubeClient | None,
    node_name: str | None,
    clock: Clock = time.time,
    proc: Path = Path("/proc"),
) -> Reloader:
    """Build the configured reloader, refusing settings that could not work before any write."""
    if method == "sighup":
        return SighupReloader(process_name, clock, proc)
    if method == "none":
        return NoReload(clock)
    if method not in RELOAD_METHODS:
        raise InvalidSpec(
            f"unknown reload method {method!r}",
            [FieldViolation("sharing.reload", f"must be one of {', '.join(RELOAD_METHODS)}")],
        )
    problems = []
    if kube is None:
        problems.append(
            FieldViolation(
                "sharing.reload",
                f"{method} needs the Kubernetes API: run in a pod with a service account",
            )
        )
    if not node_name:
        problems.append(
            FieldViolation("node_name", f"reload {method} needs the node name (NODE_NAME)")
        )
    if method == "label" and not is_label_name(label_config_name):
        problems.append(
            FieldViolation(
                "sharing.label_config_name",
                "must be a valid label value: at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit",
            )
        )
    if problems or kube is None or not node_name:
        raise InvalidSpec(f"reload method {method} is not usable here", problems)
    if method == "label":
        return LabelReloader(kube, node_name, label_config_name, clock)
    return RestartPodReloader(kube, node_name, namespace, label_selector, clock)


def pickup(
    *,
    file_sha256: str | None,
    file_mtime: float | None,
    status: StatusRecord | None,
    processes: Sequence[PluginProcess],
    process_name: str,
    unseen_dir: Path | None = None,
    hidden: bool = False,
) -> Pickup:
    """Judge from the status record and the plugin processes now running. Pure.
    ``unseen_dir``: the config's directory, when it is not there to read (not mounted).
    ``hidden``: the node's processes are not visible here (`pidns.hides`)."""
    if unseen_dir is not None:
        return Pickup(
            "unknown",
            f"{unseen_dir} is not mounted into the agent: which config the plugin runs with is "
            "not known",
        )
    if file_sha256 is None or file_mtime is None:
        return Pickup("unknown", "no config file: the plugin runs with its defaults")
    ours = status is not None and status.sha256 == file_sha256
    written_at = status.written_at if status is not None and ours else file_mtime
    after = [p for p in processes if p.started_at > written_at + START_TIME_RESOLUTION]
    if after:
        pids = ", ".join(str(p.pid) for p in after)
        return Pickup("loaded", f"{process_name} pid {pids} started after the config was written")
    reload = status.reload if status is not None and ours else None
    running = {p.pid for p in processes}
    if reload is not None and reload.method == "sighup" and running & set(reload.pids):
        pids = ", ".join(str(p) for p in sorted(running & set(reload.pids)))
        return Pickup("signalled", f"pid {pids} was sent SIGHUP after the config was written")
    if reload is not None and reload.method == "label" and reload.done:
        return Pickup(
            "unknown",
            "the config label was switched; config-manager signals the plugin, which is not "
            "observable from here",
        )
    if not processes and hidden:  # not seen is no evidence that none runs
        return Pickup(
            "unknown",
            f"{NO_HOSTPID}: whether {process_name} loaded the config is not observable (run "
            "the agent with hostPID: true)",
        )
    if not processes:
        return Pickup(
            "not-loaded",
            f"no {process_name} process is running (or visible: the agent needs hostPID); it "
            "reads the config when it starts",
        )
    close = [p for p in processes if p.started_at >= written_at - START_TIME_RESOLUTION]
    if close:
        pids = ", ".join(str(p.pid) for p in close)
        return Pickup(
            "unknown",
            f"{process_name} pid {pids} started within a second of the write (process start "
            "times are that coarse): whether it read the new config is not observable",
        )
    pids = ", ".join(str(p.pid) for p in processes)
    if not ours:
        return Pickup(
            "unknown",
            f"the file was not written by gpu-agent (or changed since); whether {process_name} "
            f"pid {pids} reloaded it is not observable",
        )
    return Pickup(
        "not-loaded",
        f"{process_name} pid {pids} started before the config was written and was not "
        "signalled since",
    )
