"""GPU sharing on this node: show, set, clear and roll back the device plugin's sharing config,
or, on a node whose GPUs a DRA driver hands out, the DeviceClasses carrying the driver's config.

The flow of every change: read the current state, decide (merge, validate: pure), and only then
write and reload. A refused change writes nothing; an unchanged one neither writes nor reloads.

Which of the two a change goes to is the node's allocation mode, read from the ``allocation``
callable on every call (`agent.dra.mode.Allocation`; the detection lives in agent/dra): ``dra``
and ``dra-dynamic-mig`` render the spec as DeviceClasses (`agent.sharing.dra_service`), ``unknown``
refuses every change naming the mode, and the others (``device-plugin``, ``none``) write the
plugin's file as before. Without a callable the mode is ``none``: the plugin's file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from agent import pidns
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import (
    AgentError,
    Conflict,
    DriverNotReady,
    FieldViolation,
    InvalidSpec,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from agent.gpu.types import GpuLayout
from agent.kube import KubeClient
from agent.kube_watch import Informer
from agent.sharing import strategy
from agent.sharing.advertise import Advertised, advertise
from agent.sharing.dra_service import DraSharing
from agent.sharing.reload import (
    PluginProcess,
    Reloader,
    find_plugin_processes,
    make_reloader,
    pickup,
    reload_again,
)
from agent.sharing.schema import (
    PluginConfig,
    Sharing,
    merge,
    render,
    unmanaged_changes,
)
from agent.sharing.store import ConfigStore, parse_file
from agent.sharing.validate import validate, violations
from agent.sharing.view import (
    ApplyResult,
    Pickup,
    ReloadReport,
    SharingView,
    StatusRecord,
)


class SharingSettings(Protocol):
    """The ``sharing`` part of the agent config (agent/config/sections.py provides a dataclass
    of it)."""

    @property
    def config_path(self) -> Path: ...
    @property
    def reload(self) -> str: ...
    @property
    def plugin_process_name(self) -> str: ...
    @property
    def label_config_name(self) -> str: ...
    @property
    def plugin_namespace(self) -> str: ...
    @property
    def plugin_label_selector(self) -> str: ...


def no_detection() -> Allocation:
    """The mode when nothing detects one: ``none``, so sharing writes the plugin's file."""
    return Allocation(AllocationMode.NONE, "no allocation-mode detection wired")


class SharingService:
    def __init__(
        self,
        settings: SharingSettings,
        layouts_provider: Callable[[], Sequence[GpuLayout]],
        kube: KubeClient | None = None,
        *,
        node_name: str | None = None,
        clock: Callable[[], float] = time.time,
        allocation: Callable[[], Allocation] = no_detection,
        proc: Path = Path("/proc"),
        namespace_proc: Path | None = None,
        gpus_unread: Callable[[], str] = lambda: "",
        gpus_lost: Callable[[], Sequence[int]] = tuple,
        gpus_not_read: Callable[[], Mapping[int, str]] = dict,
        device_classes: Informer | None = None,
    ) -> None:
        """``gpus_unread``: why the node's GPUs were not read ("" once they were): what the
        plugin advertises is then unknown, and a config that must be checked against them is
        refused. ``gpus_lost``: the GPUs that do not answer; the plugin's own read of them fails
        too, so what it advertises is not known either (a config is still checked against the
        GPUs that answer). ``gpus_not_read``: the GPUs listed, not lost, whose reads fail
        (index -> the failing call): left out of the layouts as lost ones are, and what the
        plugin advertises is not known either. ``device_classes``: the watch of the agents'
        DeviceClasses that a DRA node's show reads (`agent.sharing.dra_kube`); without one each
        show lists them. ``namespace_proc``: the /proc whose self/ns/pid says the agent's PID
        namespace (without hostPID the plugin is not seen: `pidns`), ``proc`` unless given (the
        simulator's)."""
        self._gpus_unread = gpus_unread
        self._gpus_lost = gpus_lost
        self._gpus_not_read = gpus_not_read
        self._settings = settings
        self._proc = proc
        self._namespace_proc = namespace_proc or proc
        self._allocation = allocation
        self._layouts = layouts_provider
        self._kube = kube
        self._node_name = node_name
        self._clock = clock
        self._store = ConfigStore(settings.config_path)
        #: On DRA nodes: the DeviceClasses, and the spec as last set beside the plugin's file.
        self._dra = DraSharing(settings.config_path, kube, clock, device_classes)

    def show(self) -> SharingView:
        allocation = self._allocation()
        if allocation.mode.is_dra:
            return self._dra.show(allocation)
        raw = self._store.read()
        config = self._parse_current(raw)
        layouts = self._layouts()
        status_raw = self._store.read_status()
        status = StatusRecord.from_json(status_raw) if status_raw is not None else None
        sha = _sha256(raw) if raw is not None else None
        last_write = status if status is not None and status.sha256 == sha else None
        processes = find_plugin_processes(self._settings.plugin_process_name)
        started, seen = self._started(processes)
        runs = strategy.run_with(config, started)
        unread = self._gpus_unread()
        unknown = self._advertised_unknown(config, started, seen, layouts)
        if allocation.mode is AllocationMode.UNKNOWN:  # a device plugin may not be what runs
            unknown = (
                f"allocation mode {allocation.describe()}: whether a device plugin or a DRA "
                "driver hands out these GPUs is not known yet"
            )
        advertised = advertise(runs, layouts) if runs is not None and not unknown else ()
        loaded = self._pickup(sha, status, processes)
        advertised, unknown = _until_loaded(loaded, advertised, unknown)
        return SharingView(
            config_path=self._store.path,
            exists=raw is not None,
            config=config,
            advertised=advertised,
            problems=() if unread else _problems(config, started, seen, layouts),
            pickup=loaded,
            last_write=last_write,
            advertised_unknown=unknown,
        )

    def _pickup(
        self, sha: str | None, status: StatusRecord | None, processes: Sequence[PluginProcess]
    ) -> Pickup:
        """Whether the plugin runs the file whose digest is ``sha`` (None: no file)."""
        parent = self._store.path.parent
        return pickup(
            file_sha256=sha,
            file_mtime=self._store.mtime(),
            status=status,
            processes=processes,
            process_name=self._settings.plugin_process_name,
            unseen_dir=None if parent.is_dir() else parent,
            hidden=pidns.hides(self._namespace_proc),
        )

    def _advertised_unknown(
        self,
        config: PluginConfig,
        started: strategy.Strategy | None,
        seen: bool,
        layouts: Sequence[GpuLayout],
    ) -> str:
        """Why what the plugin advertises with ``config`` is not known ("" when it is): the
        GPUs not read or lost, or the strategy it runs with where that matters."""
        unread = self._gpus_unread()
        if unread:
            return f"the GPUs were not read ({unread})"
        lost = self._gpus_lost()
        said = [f"GPU {', '.join(map(str, lost))} lost"] if lost else []
        said += [f"GPU {i} cannot be read ({why})" for i, why in self._gpus_not_read().items()]
        if said:
            return (
                f"{'; '.join(said)}: the plugin's own read of it fails (it may not start, or may "
                "leave it out)"
            )
        return strategy.unknown_and_matters(config, started, seen, layouts) or ""

    def _result(
        self,
        action: str,
        changed: bool,
        config: PluginConfig,
        layouts: Sequence[GpuLayout],
        report: ReloadReport | None,
    ) -> ApplyResult:
        """A change's answer, with what the plugin advertises now, or why that is not known
        (as `show`: not before the plugin has loaded the file)."""
        processes = find_plugin_processes(self._settings.plugin_process_name)
        started, seen = self._started(processes)
        unknown = self._advertised_unknown(config, started, seen, layouts)
        runs = strategy.run_with(config, started)
        advertised = advertise(runs, layouts) if runs is not None and not unknown else ()
        raw = self._store.read()
        status_raw = self._store.read_status()
        loaded = self._pickup(
            _sha256(raw) if raw is not None else None,
            StatusRecord.from_json(status_raw) if status_raw is not None else None,
            processes,
        )
        advertised, unknown = _until_loaded(loaded, advertised, unknown)
        return ApplyResult(
            action,
            changed,
            self._store.path,
            config,
            advertised,
            report,
            advertised_unknown=unknown,
            problems=() if self._gpus_unread() else _problems(config, started, seen, layouts),
        )

    def _require_gpus(self, action: str) -> None:
        """A config checked against the GPUs needs them read: no driver is never "valid"."""
        unread = self._gpus_unread()
        if unread:
            raise DriverNotReady(
                f"share {action} needs the node's GPUs read (the config is checked against "
                f"them): {unread}"
            )

    def set(
        self,
        requested: PluginConfig,
        *,
        keep_sharing: bool = False,
        plugin_settings: bool = True,
    ) -> ApplyResult:
        """Make ``requested.sharing`` the node's sharing.

        Its ``flags`` and other sections are laid over the current file's (which the plugin
        shares), so a request without them keeps e.g. ``failOnInitError`` as it was; with
        ``keep_sharing`` only they change, and the file's sharing stays (`share set
        --mig-strategy` alone: read and written under one lock). On a DRA node: the
        DeviceClasses ``requested`` renders, nothing merged. Without ``plugin_settings`` (a
        caller that is not an admin) a request that would change a flag other than
        ``migStrategy`` or another section is refused with PermissionDenied.
        """
        allocation = self._mode_for_change()
        if allocation.mode.is_dra:
            if keep_sharing:
                raise NotSupported(
                    f"allocation mode {allocation.mode.value}: no device plugin, so no MIG "
                    "strategy of its own to set; set the sharing spec (docs/dra.md)"
                )
            return self._dra.set(allocation, requested)
        self._require_gpus("set")
        reloader = self._reloader()
        with self._store.lock():
            raw = self._store.read()
            current = self._parse_current(raw)
            desired = merge(current, requested)
            if keep_sharing:
                desired = dataclasses.replace(desired, sharing=current.sharing)
            if not plugin_settings:
                _refuse_unmanaged(current, desired)
            layouts = self._layouts()
            started, _ = self._started(find_plugin_processes(self._settings.plugin_process_name))
            _refuse_as_set(requested, desired, started, layouts)
            return self._apply("set", current, desired, layouts, reloader)

    def clear(self) -> ApplyResult:
        """Stop sharing: keep the file's flags and other sections, drop ``sharing``. On a DRA
        node: the node's spec is forgotten and no DeviceClass is written (others may use it)."""
        allocation = self._mode_for_change()
        if allocation.mode.is_dra:
            return self._dra.clear(allocation)
        reloader = self._reloader()
        with self._store.lock():
            current = self._parse_current(self._store.read())
            desired = PluginConfig(flags=current.flags, sharing=Sharing(), other=current.other)
            return self._apply("clear", current, desired, self._layouts(), reloader)

    def rollback(self, *, plugin_settings: bool = True) -> ApplyResult:
        """Restore the previous config; the current one becomes the previous (undo by repeating).
        Without ``plugin_settings`` (not an admin), PermissionDenied when that would change a
        flag other than ``migStrategy`` or another section."""
        allocation = self._mode_for_change()
        if allocation.mode.is_dra:
            return self._dra.rollback(allocation)
        self._require_gpus("rollback")
        reloader = self._reloader()
        with self._store.lock():
            previous_raw = self._store.read_previous()
            current_raw = self._store.read()
            if previous_raw is None:
                raise NotFound(
                    f"no previous config at {self._store.previous_path}: nothing to roll back to"
                )
            previous = parse_file(previous_raw, self._store.previous_path)
            if not plugin_settings:
                _refuse_unmanaged(self._parse_current(current_raw), previous)
            layouts = self._layouts()
            started, _ = self._started(find_plugin_processes(self._settings.plugin_process_name))
            try:
                _refuse_as_set(previous, previous, started, layouts)
            except InvalidSpec as exc:
                raise InvalidSpec(
                    "cannot roll back: the previous config is refused on this node now",
                    exc.violations,
                ) from exc
            if previous_raw == current_raw:  # as a set of the same config: a lost reload retried
                again = self._reload_unloaded("rollback", previous, layouts, reloader)
                return again or self._result("rollback", False, previous, layouts, None)
            reloader.check()
            self._store.swap_with_previous(previous_raw)
            return self._reload_and_record("rollback", previous_raw, previous, layouts, reloader)

    def _apply(
        self,
        action: str,
        current: PluginConfig,
        desired: PluginConfig,
        layouts: Sequence[GpuLayout],
        reloader: Reloader,
    ) -> ApplyResult:
        if desired == current:  # written earlier, and perhaps never loaded
            again = self._reload_unloaded(action, desired, layouts, reloader)
            return again or self._result(action, False, desired, layouts, None)
        data = render(desired).encode()
        reloader.check()
        self._store.write(data)
        return self._reload_and_record(action, data, desired, layouts, reloader)

    def _reload_and_record(
        self,
        action: str,
        data: bytes,
        config: PluginConfig,
        layouts: Sequence[GpuLayout],
        reloader: Reloader,
    ) -> ApplyResult:
        written_at = self._clock()
        try:
            report = reloader.reload()
        except AgentError as exc:
            self._store.write_status(
                StatusRecord(action, _sha256(data), written_at, None).to_json()
            )
            # Same error class (so the exit code still says why), with what did happen.
            raise type(exc)(
                f"config written to {self._store.path}, but reloading the plugin "
                f"({self._settings.reload}) failed: {exc}"
            ) from exc
        self._store.write_status(StatusRecord(action, _sha256(data), written_at, report).to_json())
        return self._result(action, True, config, layouts, report)

    def _reload_unloaded(
        self,
        action: str,
        config: PluginConfig,
        layouts: Sequence[GpuLayout],
        reloader: Reloader,
    ) -> ApplyResult | None:
        """The file already says ``config``, but the plugin has not loaded it (a reload that
        did not reach it): reload it again, nothing written (``changed`` False, with the
        reload's report). None unless `reload_again` says so, and with reload ``none``
        (something else reloads it)."""
        raw = self._store.read()
        if raw is None or self._settings.reload == "none":
            return None
        sha = _sha256(raw)
        status_raw = self._store.read_status()
        status = StatusRecord.from_json(status_raw) if status_raw is not None else None
        processes = find_plugin_processes(self._settings.plugin_process_name)
        pickup = self._pickup(sha, status, processes)
        if not reload_again(pickup, status, sha, by_signal=self._settings.reload == "sighup"):
            return None
        ours = status is not None and status.sha256 == sha
        mtime = self._store.mtime()
        written_at = status.written_at if status is not None and ours else mtime or self._clock()
        did = status.action if status is not None and ours else action
        try:
            report = reloader.reload()
        except AgentError as exc:
            raise type(exc)(
                f"{self._store.path} already says this, but the plugin has not loaded it and "
                f"reloading it ({self._settings.reload}) failed: {exc}"
            ) from exc
        self._store.write_status(StatusRecord(did, sha, written_at, report).to_json())
        return self._result(action, False, config, layouts, report)

    def reload_for_mig_change(self) -> str:
        """After a MIG layout change, make the device plugin enumerate its devices again with
        the configured reload, and say what happened. ``label`` cannot: config-manager acts
        only on a change of its label, and the GPU Operator restarts the plugin itself around a
        change made through ``nvidia.com/mig.config``."""
        if self._settings.reload == "label":
            return (
                "not reloaded: reload label switches configs and cannot restart the plugin for "
                "a MIG change; with the GPU Operator, change MIG through nvidia.com/mig.config "
                "(mig.watch_node_label), which restarts it"
            )
        report = self._reloader().reload()
        return report.detail if report.done else f"not reloaded: {report.detail}"

    def _started(self, processes: Sequence[PluginProcess]) -> tuple[strategy.Strategy | None, bool]:
        """The MIG strategy the running plugin's own flag or environment sets (None: the file
        decides), and whether the plugin was seen well enough to say so."""
        if not processes:
            return None, False
        started, caveat = strategy.read_started_with(self._proc, processes[0].pid)
        return started, not caveat

    def _reloader(self) -> Reloader:
        # Built before any write, so settings that cannot work refuse the change up front.
        s = self._settings
        return make_reloader(
            s.reload,
            process_name=s.plugin_process_name,
            label_config_name=s.label_config_name,
            namespace=s.plugin_namespace,
            label_selector=s.plugin_label_selector,
            kube=self._kube,
            node_name=self._node_name,
            clock=self._clock,
            proc=self._namespace_proc,
        )

    def _mode_for_change(self) -> Allocation:
        allocation = self._allocation()
        if allocation.mode is AllocationMode.UNKNOWN:
            raise Conflict(
                f"allocation mode {allocation.describe()}: sharing is not changed until the "
                "node's mode is known (device plugin or DRA); retry when it is"
            )
        return allocation

    def _parse_current(self, raw: bytes | None) -> PluginConfig:
        return parse_file(raw, self._store.path)


def _until_loaded(
    loaded: Pickup, advertised: tuple[Advertised, ...], unknown: str
) -> tuple[tuple[Advertised, ...], str]:
    """(advertised, why not known): what the config makes the plugin advertise is what it
    advertises only once it has loaded the file (``loaded`` or ``signalled``); before, not
    known, and the why says what it will advertise once it does."""
    if unknown or loaded.state in ("loaded", "signalled"):
        return advertised, unknown
    will = ", ".join(f"{a.resource} {a.count}" for a in advertised) or "no GPU resources"
    return (), (
        f"the plugin has not loaded this config (plugin {loaded.state}: {loaded.detail}); once "
        f"it does it advertises {will}"
    )


def _problems(
    config: PluginConfig,
    started: strategy.Strategy | None,
    seen: bool,
    layouts: Sequence[GpuLayout],
) -> tuple[FieldViolation, ...]:
    """What ``config`` breaks on this node as the plugin runs it (show's problems; a change
    answers with them too, since it does not refuse all of them)."""
    runs = strategy.run_with(config, started)
    return (
        *_strategy_problems(config, started, seen, layouts),
        *violations(runs or config, layouts),
    )


def _strategy_problems(
    config: PluginConfig,
    started: strategy.Strategy | None,
    seen: bool,
    layouts: Sequence[GpuLayout],
) -> list[FieldViolation]:
    """The file's migStrategy overridden by the plugin's own, and MIG devices the strategy the
    plugin runs with does not expose (agent/sharing/strategy.py). With no strategy in the file
    and the plugin not seen, which one it runs with is unknown: nothing is said of it here
    (`gpu-agent doctor` says so)."""
    found = [strategy.override_problem(config, started)]
    if started is not None or seen or config.flags.mig_strategy is not None:
        runs = strategy.effective(config.flags.mig_strategy, started)
        found.append(strategy.problem(runs.value, layouts))
    return [FieldViolation("flags.migStrategy", why) for why in found if why is not None]


def _refuse_as_set(
    requested: PluginConfig,
    desired: PluginConfig,
    started: strategy.Strategy | None,
    layouts: Sequence[GpuLayout],
) -> None:
    """What ``set`` refuses, and a rollback to ``desired`` too: a migStrategy ``requested``
    sets that the plugin's own flag or environment overrides, then ``desired`` (the file to
    write) against the rules as the plugin runs it. InvalidSpec naming every violation."""
    _refuse_overridden(requested, started)
    validate(strategy.run_with(desired, started) or desired, layouts)


def _refuse_unmanaged(current: PluginConfig, desired: PluginConfig) -> None:
    """The plugin's other settings (e.g. ``flags.plugin.deviceListStrategy``, which decides
    whether a pod may ask for GPUs through its environment) are not sharing: an admin's."""
    changed = unmanaged_changes(current, desired)
    if changed:
        raise PermissionDenied(
            f"{', '.join(changed)} would change: the device plugin's settings other than "
            "sharing and flags.migStrategy need the admin role; leave them as the file has "
            "them"
        )


def _refuse_overridden(requested: PluginConfig, started: strategy.Strategy | None) -> None:
    """A migStrategy the plugin's own flag or environment overrides would be written for
    nothing: refused, naming where to change it."""
    wanted = requested.flags.mig_strategy
    if wanted is None or started is None or started.value == wanted:
        return
    raise InvalidSpec(
        f"flags.migStrategy {wanted} would be ignored",
        [FieldViolation("flags.migStrategy", strategy.override_problem(requested, started) or "")],
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
