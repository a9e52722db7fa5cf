"""GPU sharing on a node whose GPUs a DRA driver hands out: the spec as DeviceClasses carrying
the driver's config (`agent.sharing.dra` plans them, `agent.sharing.dra_kube` writes them), and
the spec as last set kept beside the plugin's file (``<config>.dra``) for show and rollback.
`agent.sharing.service.SharingService` sends a change here when the node's mode is DRA.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from agent.dra.mode import Allocation
from agent.errors import AgentError, FieldViolation, InvalidSpec, NotFound, NotSupported
from agent.kube import KubeClient
from agent.kube_watch import Informer
from agent.sharing import dra, dra_api
from agent.sharing.dra_kube import DeviceClasses, DraKube
from agent.sharing.schema import PluginConfig, Sharing, render
from agent.sharing.store import ConfigStore, parse_file
from agent.sharing.view import (
    ApplyResult,
    DraObject,
    DraView,
    Pickup,
    SharingView,
    StatusRecord,
)

__all__ = ["DraSharing"]

_STATE = {"create": "created", "unchanged": "unchanged"}


class DraSharing:
    def __init__(
        self,
        config_path: Path,
        kube: KubeClient | None,
        clock: Callable[[], float],
        device_classes: Informer | None = None,
    ) -> None:
        """``device_classes``: the watch of the agents' DeviceClasses that show reads; without
        one each show lists them."""
        self._kube = kube
        self._clock = clock
        self._device_classes = device_classes
        self._store = ConfigStore(config_path.with_name(config_path.name + ".dra"))

    def _classes(self) -> DeviceClasses:
        if not isinstance(self._kube, DraKube):
            raise NotSupported(
                "sharing on a DRA node writes DeviceClasses: the agent has no Kubernetes API "
                "client here (run it in the cluster, or give it a kubeconfig)"
            )
        return DeviceClasses(self._kube, self._device_classes)

    def set(self, allocation: Allocation, requested: PluginConfig) -> ApplyResult:
        planned = dra.plan(requested, allocation)  # InvalidSpec before anything is touched
        desired = PluginConfig(sharing=requested.sharing, flags=requested.flags)
        return self._apply("set", allocation, planned, desired)

    def clear(self, allocation: Allocation) -> ApplyResult:
        return self._apply("clear", allocation, dra.DraPlan((), ()), PluginConfig())

    def rollback(self, allocation: Allocation) -> ApplyResult:
        with self._store.lock():
            previous_raw = self._store.read_previous()
        if previous_raw is None:
            raise NotFound(
                f"no previous spec at {self._store.previous_path}: nothing to roll back to"
            )
        previous = parse_file(previous_raw, self._store.previous_path)
        if previous.sharing == Sharing():
            return self._apply("rollback", allocation, dra.DraPlan((), ()), previous)
        try:
            planned = dra.plan(previous, allocation)
        except InvalidSpec as exc:
            raise InvalidSpec(
                "cannot roll back: the previous spec is refused on this node now", exc.violations
            ) from exc
        return self._apply("rollback", allocation, planned, previous)

    def _apply(
        self, action: str, allocation: Allocation, planned: dra.DraPlan, spec: PluginConfig
    ) -> ApplyResult:
        classes = self._classes()
        with self._store.lock():
            # Only the classes this spec names: a clear, or what an older spec named, writes
            # nothing to the cluster (other nodes may use them).
            existing = classes.current([s.name for s in planned.classes])
            changes = dra.reconcile(planned.classes, existing)  # Conflict: no write
            done = classes.apply(changes, planned.classes)
            data = render(spec).encode()
            current = self._store.read()
            wrote = current != data and not (current is None and spec == PluginConfig())
            if wrote:
                if action == "rollback":
                    self._store.swap_with_previous(data)
                else:
                    self._store.write(data)
                self._store.write_status(
                    StatusRecord(action, _sha256(data), self._clock(), None).to_json()
                )
        objects = tuple(DraObject("DeviceClass", c.name, _STATE[c.action], c.body) for c in done)
        changed = wrote or any(c.action != "unchanged" for c in done)
        return ApplyResult(
            action,
            changed,
            self._store.path,
            spec,
            (),
            None,
            DraView(allocation, objects, planned.notes),
        )

    def show(self, allocation: Allocation) -> SharingView:
        raw = self._store.read()
        config = parse_file(raw, self._store.path)
        status_raw = self._store.read_status()
        status = StatusRecord.from_json(status_raw) if status_raw is not None else None
        last_write = (
            status
            if status is not None and raw is not None and (status.sha256 == _sha256(raw))
            else None
        )
        problems: list[FieldViolation] = []
        notes: tuple[FieldViolation, ...] = ()
        wanted: dict[str, dra.SharedClass] = {}
        if config.sharing != Sharing():
            try:
                planned = dra.plan(config, allocation)
            except InvalidSpec as exc:
                problems += exc.violations
            else:
                notes = planned.notes
                wanted = {s.name: s for s in planned.classes}
        objects: list[DraObject] = []
        error = ""
        try:
            found = {str(o["metadata"].get("name")): o for o in self._classes().owned()}
        except AgentError as exc:
            error = str(exc)
        else:
            for name, want in sorted(wanted.items()):
                obj = found.get(name)
                if obj is None:
                    objects.append(DraObject("DeviceClass", name, "missing", {}))
                    problems.append(
                        FieldViolation(name, "DeviceClass missing: run share set again")
                    )
                    continue
                state = "present"
                if not dra.same_spec(obj, dra.class_spec(want)):
                    state = "differs"
                    problems.append(
                        FieldViolation(name, "DeviceClass differs from the spec set on this node")
                    )
                for entry in (obj.get("spec") or {}).get("config") or []:
                    opaque = entry.get("opaque") if isinstance(entry, dict) else None
                    if isinstance(opaque, dict) and opaque.get("driver") == dra_api.DRIVER:
                        problems += dra_api.violations(
                            opaque.get("parameters"), f"{name}.spec.config.opaque.parameters"
                        )
                objects.append(DraObject("DeviceClass", name, state, obj))
        return SharingView(
            config_path=self._store.path,
            exists=raw is not None,
            config=config,
            advertised=(),
            problems=tuple(problems),
            pickup=Pickup(
                "unknown",
                f"allocation mode {allocation.mode.value}: no device plugin to load it; the DRA "
                "driver reads a DeviceClass's config when it prepares a claim",
            ),
            last_write=last_write,
            dra=DraView(allocation, tuple(objects), notes, error),
        )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
