"""GPU sharing on this node: show, set, clear and roll back the device plugin's sharing config.

The flow of every change: read the current file, decide (merge, validate: pure), and only then
write atomically and reload the plugin. A refused change writes nothing; an unchanged one
neither writes nor reloads.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.errors import AgentError, Conflict, FieldViolation, InvalidSpec, NotFound
from agent.gpu.types import GpuLayout
from agent.kube import KubeClient
from agent.sharing.advertise import Advertised, advertise
from agent.sharing.reload import (
    Pickup,
    Reloader,
    ReloadReport,
    StatusRecord,
    find_plugin_processes,
    make_reloader,
    pickup,
)
from agent.sharing.schema import PluginConfig, Sharing, merge, parse, render
from agent.sharing.store import ConfigStore
from agent.sharing.validate import validate, violations


class SharingSettings(Protocol):
    """The ``sharing`` part of the agent config (agent/config.py provides a dataclass of it)."""

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


@dataclass(frozen=True, slots=True)
class SharingView:
    """The node's sharing as ``share show`` reports it."""

    config_path: Path
    exists: bool
    config: PluginConfig
    advertised: tuple[Advertised, ...]
    #: Rules the file on disk breaks on this node now (e.g. after a MIG change).
    problems: tuple[FieldViolation, ...]
    pickup: Pickup
    #: The agent's record of the file on disk; None when the agent did not write it.
    last_write: StatusRecord | None


@dataclass(frozen=True, slots=True)
class ApplyResult:
    action: str
    #: False when the file already said this: nothing was written, the plugin not reloaded.
    changed: bool
    config_path: Path
    config: PluginConfig
    advertised: tuple[Advertised, ...]
    reload: ReloadReport | None


class SharingService:
    def __init__(
        self,
        settings: SharingSettings,
        layouts_provider: Callable[[], Sequence[GpuLayout]],
        kube: KubeClient | None = None,
        *,
        node_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._layouts = layouts_provider
        self._kube = kube
        self._node_name = node_name
        self._clock = clock
        self._store = ConfigStore(settings.config_path)

    def show(self) -> SharingView:
        raw = self._store.read()
        config = self._parse_current(raw)
        layouts = self._layouts()
        status_raw = self._store.read_status()
        status = StatusRecord.from_json(status_raw) if status_raw is not None else None
        sha = _sha256(raw) if raw is not None else None
        last_write = status if status is not None and status.sha256 == sha else None
        return SharingView(
            config_path=self._store.path,
            exists=raw is not None,
            config=config,
            advertised=advertise(config, layouts),
            problems=tuple(violations(config, layouts)),
            pickup=pickup(
                file_sha256=sha,
                file_mtime=self._store.mtime(),
                status=status,
                processes=find_plugin_processes(self._settings.plugin_process_name),
                process_name=self._settings.plugin_process_name,
            ),
            last_write=last_write,
        )

    def set(self, requested: PluginConfig) -> ApplyResult:
        """Make ``requested.sharing`` the node's sharing.

        Its ``flags`` and other sections are laid over the current file's (which the plugin
        shares), so a request without them keeps e.g. ``failOnInitError`` as it was.
        """
        reloader = self._reloader()
        with self._store.lock():
            raw = self._store.read()
            current = self._parse_current(raw)
            desired = merge(current, requested)
            layouts = self._layouts()
            validate(desired, layouts)
            return self._apply("set", current, desired, layouts, reloader)

    def clear(self) -> ApplyResult:
        """Stop sharing: keep the file's flags and other sections, drop ``sharing``."""
        reloader = self._reloader()
        with self._store.lock():
            current = self._parse_current(self._store.read())
            desired = PluginConfig(flags=current.flags, sharing=Sharing(), other=current.other)
            return self._apply("clear", current, desired, self._layouts(), reloader)

    def rollback(self) -> ApplyResult:
        """Restore the previous config; the current one becomes the previous (undo by repeating)."""
        reloader = self._reloader()
        with self._store.lock():
            previous_raw = self._store.read_previous()
            current_raw = self._store.read()
            if previous_raw is None:
                raise NotFound(
                    f"no previous config at {self._store.previous_path}: nothing to roll back to"
                )
            previous = self._parse(previous_raw, self._store.previous_path)
            layouts = self._layouts()
            found = violations(previous, layouts)
            if found:
                raise InvalidSpec(
                    "cannot roll back: the previous config is refused on this node now", found
                )
            if previous_raw == current_raw:
                return ApplyResult(
                    "rollback",
                    False,
                    self._store.path,
                    previous,
                    advertise(previous, layouts),
                    None,
                )
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
        if desired == current:
            return ApplyResult(
                action, False, self._store.path, desired, advertise(desired, layouts), None
            )
        data = render(desired).encode()
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
        return ApplyResult(
            action, True, self._store.path, config, advertise(config, layouts), report
        )

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
        )

    def _parse_current(self, raw: bytes | None) -> PluginConfig:
        return PluginConfig() if raw is None else self._parse(raw, self._store.path)

    @staticmethod
    def _parse(raw: bytes, path: Path) -> PluginConfig:
        try:
            return parse(raw)
        except InvalidSpec as exc:
            problems = "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
            raise Conflict(
                f"{path} is not a valid device-plugin config ({problems}); fix or remove it"
            ) from exc


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
