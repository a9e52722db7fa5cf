"""What sharing reports: the node's sharing as shown, what a change did, how the plugin took it,
and the agent's record of the file it wrote. Records only, apart from the service (which needs
the Kubernetes client and the plugin's processes), so that the wire layer and the clients read
them without loading it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.dra.mode import Allocation
from agent.errors import FieldViolation
from agent.sharing.advertise import Advertised
from agent.sharing.schema import PluginConfig

__all__ = [
    "ApplyResult",
    "DraObject",
    "DraView",
    "Pickup",
    "PickupState",
    "ReloadReport",
    "SharingView",
    "StatusRecord",
]

PickupState = Literal["loaded", "signalled", "not-loaded", "unknown"]


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What one reload attempt did. ``done`` is False when nothing reached the plugin."""

    method: str
    done: bool
    detail: str
    at: float
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """What the agent last wrote and how it reloaded the plugin (``<path>.status.json``)."""

    action: str
    sha256: str
    written_at: float
    reload: ReloadReport | None

    def to_json(self) -> dict[str, object]:
        reload = None
        if self.reload is not None:
            r = self.reload
            reload = {
                "method": r.method,
                "done": r.done,
                "detail": r.detail,
                "at": r.at,
                "pids": list(r.pids),
            }
        return {
            "action": self.action,
            "sha256": self.sha256,
            "written_at": self.written_at,
            "reload": reload,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StatusRecord | None:
        """None when the record does not have the expected shape (see ConfigStore.read_status)."""
        try:
            reload_raw = raw["reload"]
            reload = None
            if isinstance(reload_raw, Mapping):
                reload = ReloadReport(
                    str(reload_raw["method"]),
                    bool(reload_raw["done"]),
                    str(reload_raw["detail"]),
                    float(reload_raw["at"]),
                    tuple(int(p) for p in reload_raw["pids"]),
                )
            return cls(str(raw["action"]), str(raw["sha256"]), float(raw["written_at"]), reload)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Pickup:
    """Whether the plugin runs the config now in the file, and the evidence for it.

    ``loaded``: a plugin process started after the file was written (it reads it at start-up).
    ``signalled``: the running plugin was sent SIGHUP after the write (it reloads on SIGHUP; the
    reload itself is not observable). ``not-loaded``: the running plugin predates the file and
    was not signalled, or no plugin runs. ``unknown``: no evidence either way.
    """

    state: PickupState
    detail: str


@dataclass(frozen=True, slots=True)
class DraObject:
    """One object of the node's DRA sharing, and what became of it (or what state it is in)."""

    kind: str
    name: str
    #: created or unchanged (a change; agents before content-named classes also said updated,
    #: deleted); present, missing, differs (show)
    state: str
    body: Mapping[str, Any]
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class DraView:
    """Sharing through the DRA driver: the allocation mode, the agent's DeviceClasses for this
    node, and what of the spec the driver does not carry."""

    allocation: Allocation
    objects: tuple[DraObject, ...] = ()
    #: fields of the spec mapped or not carried, and why (`agent.sharing.dra.plan`)
    notes: tuple[FieldViolation, ...] = ()
    #: why the objects could not be read (the API server down); "" when they were
    error: str = ""


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
    #: On a DRA node: the driver's objects (config_path is then the agent's record of the spec).
    dra: DraView | None = None
    #: why ``advertised`` is not known: the node's GPUs were not read (the driver is not ready;
    #: the problems against the GPUs are not known either) or one is lost; "" when it is
    advertised_unknown: str = ""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    action: str
    #: False when the file already said this: nothing was written, and the plugin reloaded
    #: again only when it had not loaded the file (``reload`` then says how)
    changed: bool
    config_path: Path
    config: PluginConfig
    advertised: tuple[Advertised, ...]
    reload: ReloadReport | None
    #: On a DRA node: the objects written (config_path is the agent's record of the spec).
    dra: DraView | None = None
    #: why ``advertised`` is not known (the GPUs not read, or one lost); "" when it is
    advertised_unknown: str = ""
    #: rules the config in effect breaks on this node, which a change does not refuse (the
    #: migStrategy the plugin runs with leaves GPUs out): `share show` lists the same
    problems: tuple[FieldViolation, ...] = ()
