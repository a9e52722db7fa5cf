"""The sharing spec (the device plugin's schema, as ``share set`` takes it) as NVIDIA's DRA
driver config: one DeviceClass, or ResourceClaimTemplate, per shared resource. Pure.

Under DRA there is no node-wide replica count: a claim gets its device(s) for itself, and the
driver's opaque config (``resource.nvidia.com/v1beta1``, rules in `agent.sharing.dra_api`) says
how the pods and containers sharing that claim share them. The mapping, field by field
(docs/dra.md "Sharing under DRA" has the table):

- ``sharing.timeSlicing`` / ``sharing.mps``: strategy ``TimeSlicing`` / ``MPS``; both at once
  are refused, as for the plugin.
- ``resources[].name``: ``nvidia.com/gpu`` is the driver's full GPUs (``GpuConfig``, devices of
  type ``gpu``); ``nvidia.com/mig-<profile>`` its MIG devices of that profile
  (``MigDeviceConfig``, type ``mig``, attribute ``profile``; a ``.`` after ``gb`` in the resource
  name is the profile's ``+``). Any other name has no driver device: refused.
- ``replicas`` (at least 2, as for the plugin): MPS maps it to ``defaultActiveThreadPercentage``
  ``100 // replicas``, each client's share of the SMs (the plugin's MPS daemon gives each replica
  1/N of the compute). Time-slicing has no count under DRA: the replicas are not carried, and
  every answer says so (``notes``).
- time-slicing ``interval``: the plugin has none; rendered as the driver's ``Default``.
- ``renameByDefault: true``, ``failRequestsGreaterThanOne: true``, ``rename``, ``devices`` other
  than ``all``, ``flags.migStrategy: single``, other ``flags`` and the ``imex``/``resources``
  sections: plugin settings with no driver equivalent, refused naming the field.
- MPS on a node whose driver makes MIG devices per claim (``dra-dynamic-mig``): refused, the
  driver refuses MPS with its DynamicMIG gate on.

A DeviceClass is cluster-wide and its name fixes its spec (an MPS class's name carries the
share it gives: ``gpu-agent-mps-gpu-25pct``), so agents on any number of nodes that want a
class want the same object: a node creates it when it is absent and never changes or deletes
it, and no object lists the nodes (docs/dra.md, "Several nodes, one class"). The agent's
classes carry ``app.kubernetes.io/managed-by: gpu-agent``; objects rendered for GitOps
(``share render``) carry ``gpu-agent.io/rendered-by`` instead, so no agent takes them for its own.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.dra.mode import Allocation, AllocationMode
from agent.errors import Conflict, FieldViolation, InvalidSpec
from agent.safeyaml import brief
from agent.sharing import dra_api
from agent.sharing.advertise import GPU_RESOURCE
from agent.sharing.schema import (
    RESOURCE_PREFIX,
    PluginConfig,
    ReplicatedResource,
    ReplicatedResources,
)
from agent.sharing.validate import MAX_RESOURCE_NAME, MIN_REPLICAS, MPS_MAX_CLIENTS

API_VERSION = "resource.k8s.io/v1"
MANAGED_BY = "app.kubernetes.io/managed-by"
AGENT = "gpu-agent"
RENDERED_BY = "gpu-agent.io/rendered-by"
STRATEGY_LABEL = "gpu-agent.io/sharing"
RESOURCE_LABEL = "gpu-agent.io/resource"
RESOURCE_NAME = "gpu-agent.io/resource-name"
#: The DeviceClasses the driver's Helm chart installs (deviceclass-gpu.yaml, deviceclass-mig.yaml).
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
#: The one request of a rendered ResourceClaimTemplate.
REQUEST = "gpu"
_MIG_RESOURCE = re.compile(r"mig-(?P<base>\d+g\.\d+gb)(?P<rest>(?:[.-][a-z0-9]+)*)", re.ASCII)
_FLAG_STRATEGIES = ("none", "mixed")

Strategy = Literal["time-slicing", "mps"]
_DRIVER_STRATEGY: dict[str, str] = {"time-slicing": dra_api.TIME_SLICING, "mps": dra_api.MPS}


@dataclass(frozen=True, slots=True)
class SharedClass:
    """One shared resource as the driver's config: what a DeviceClass or template carries."""

    #: the spec's resource, e.g. ``nvidia.com/mig-1g.10gb``
    resource: str
    strategy: Strategy
    #: the driver's device type (``gpu`` or ``mig``) and, for MIG, the profile attribute
    device_type: Literal["gpu", "mig"]
    profile: str | None
    #: the opaque config's parameters (``GpuConfig`` or ``MigDeviceConfig``)
    parameters: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The object's name, a function of its spec and nothing else: strategy and resource
        fix the selector and the config's kind, and an MPS class's share of the SMs, the one
        parameter a spec varies, is in the name (``gpu-agent-time-slicing-gpu``,
        ``gpu-agent-mps-mig-1g.10gb-25pct``). Two specs never meet under one name."""
        name = f"{AGENT}-{self.strategy}-{self.resource.removeprefix(RESOURCE_PREFIX)}"
        mps = self.parameters["sharing"].get("mpsConfig")
        return f"{name}-{mps['defaultActiveThreadPercentage']}pct" if mps else name


@dataclass(frozen=True, slots=True)
class DraPlan:
    """The spec under DRA: the classes it renders and what of it is not carried, and why."""

    classes: tuple[SharedClass, ...]
    notes: tuple[FieldViolation, ...]


def plan(config: PluginConfig, allocation: Allocation) -> DraPlan:
    """The classes ``config`` renders on a node in ``allocation``; InvalidSpec listing every
    field the DRA driver cannot take, or would refuse."""
    found = _unmapped(config, allocation)
    sharing = config.sharing
    sections: list[tuple[Strategy, str, ReplicatedResources]] = []
    if sharing.time_slicing is not None:
        sections.append(("time-slicing", "timeSlicing", sharing.time_slicing))
    if sharing.mps is not None:
        sections.append(("mps", "mps", sharing.mps))
    if len(sections) > 1:
        found.append(
            FieldViolation("sharing", "timeSlicing and mps are mutually exclusive; keep one")
        )
    classes: list[SharedClass] = []
    notes: list[FieldViolation] = []
    for strategy, key, section in sections:
        got, bad, said = _section(strategy, key, section, allocation)
        classes += got
        found += bad
        notes += said
    if not sections:
        found.append(
            FieldViolation("sharing", "give sharing.timeSlicing or sharing.mps (to stop: clear)")
        )
    for shared in classes:
        found += dra_api.violations(shared.parameters, f"{shared.name}.parameters")
    if found:
        plural = "s" if len(found) > 1 else ""
        raise InvalidSpec(
            f"the sharing spec cannot be set through the DRA driver ({len(found)} problem{plural})",
            found,
        )
    return DraPlan(tuple(classes), tuple(notes))


def _unmapped(config: PluginConfig, allocation: Allocation) -> list[FieldViolation]:
    found = []
    if allocation.driver and allocation.driver != dra_api.DRIVER:
        found.append(
            FieldViolation(
                "sharing",
                f"the node's DRA driver is {allocation.driver}; sharing is rendered for NVIDIA's "
                f"driver ({dra_api.DRIVER}) only",
            )
        )
    strategy = config.flags.mig_strategy
    if strategy is not None and strategy not in _FLAG_STRATEGIES:
        found.append(
            FieldViolation(
                "flags.migStrategy",
                f"{strategy} has no DRA equivalent: the driver publishes full GPUs and MIG "
                "devices as devices of their own (nvidia.com/gpu is a full GPU, "
                "nvidia.com/mig-<profile> a MIG device); leave it out",
            )
        )
    for key in config.flags.other:
        found.append(
            FieldViolation(
                f"flags.{key}", "a device-plugin setting: the DRA driver replaces the plugin"
            )
        )
    for key in config.other:
        found.append(
            FieldViolation(key, "a device-plugin section: the DRA driver replaces the plugin")
        )
    return found


def _section(
    strategy: Strategy, key: str, section: ReplicatedResources, allocation: Allocation
) -> tuple[list[SharedClass], list[FieldViolation], list[FieldViolation]]:
    path = f"sharing.{key}"
    found = _section_problems(strategy, path, section, allocation)
    notes: list[FieldViolation] = []
    classes: list[SharedClass] = []
    seen: dict[str, int] = {}
    for i, res in enumerate(section.resources):
        at = f"{path}.resources[{i}]"
        target = _device(res.name) if len(res.name) <= MAX_RESOURCE_NAME else None
        found += _resource_problems(strategy, at, res, target, seen.get(res.name))
        seen.setdefault(res.name, i)
        if target is None or found:
            continue
        shared, note = _shared_class(strategy, at, res, target)
        classes.append(shared)
        notes.append(note)
    return classes, found, notes


def _section_problems(
    strategy: Strategy, path: str, section: ReplicatedResources, allocation: Allocation
) -> list[FieldViolation]:
    """What a whole strategy section asks that DRA cannot do."""
    found: list[FieldViolation] = []
    if section.rename_by_default:
        found.append(
            FieldViolation(
                f"{path}.renameByDefault",
                "no DRA equivalent: nothing is advertised under a name; pods ask for the "
                "DeviceClass by its name",
            )
        )
    if section.fail_requests_greater_than_one:
        found.append(
            FieldViolation(
                f"{path}.failRequestsGreaterThanOne",
                "no DRA equivalent: a claim asks for its device count itself and the driver "
                "does not cap it; leave it out",
            )
        )
    if strategy == "mps" and allocation.mode is AllocationMode.DRA_DYNAMIC_MIG:
        found.append(
            FieldViolation(
                "sharing.mps",
                f"allocation mode {allocation.mode.value}: the driver refuses MPS with its "
                "DynamicMIG gate on",
            )
        )
    if not section.resources:
        found.append(FieldViolation(f"{path}.resources", "at least one resource is required"))
    return found


def _resource_problems(
    strategy: Strategy,
    at: str,
    res: ReplicatedResource,
    target: tuple[Literal["gpu", "mig"], str | None] | None,
    first_seen: int | None,
) -> list[FieldViolation]:
    """What one shared resource asks that DRA cannot do (``first_seen``: an earlier index of
    the same name)."""
    found: list[FieldViolation] = []
    if target is None:
        found.append(
            FieldViolation(
                f"{at}.name",
                f"{brief(res.name)} is no device of the DRA driver: use {GPU_RESOURCE} (full "
                f"GPUs) or {RESOURCE_PREFIX}mig-<profile> (MIG devices, e.g. "
                f"{RESOURCE_PREFIX}mig-1g.10gb), at most {MAX_RESOURCE_NAME} characters",
            )
        )
    elif first_seen is not None:
        found.append(
            FieldViolation(
                f"{at}.name", f"{res.name} is listed twice (also resources[{first_seen}])"
            )
        )
    if res.replicas < MIN_REPLICAS:
        found.append(
            FieldViolation(
                f"{at}.replicas",
                f"must be >= {MIN_REPLICAS}, got {res.replicas}; use share clear to stop sharing",
            )
        )
    elif strategy == "mps" and res.replicas > MPS_MAX_CLIENTS:
        found.append(
            FieldViolation(
                f"{at}.replicas",
                f"at most {MPS_MAX_CLIENTS} (one MPS server takes {MPS_MAX_CLIENTS} clients), "
                f"got {res.replicas}",
            )
        )
    if res.rename is not None:
        found.append(FieldViolation(f"{at}.rename", "no DRA equivalent: pods name the DeviceClass"))
    if res.devices is not None and res.devices != "all":
        found.append(
            FieldViolation(
                f"{at}.devices",
                "no DRA equivalent: a claim gets the devices the scheduler allocates; "
                "select GPUs in the claim instead",
            )
        )
    return found


def _shared_class(
    strategy: Strategy,
    at: str,
    res: ReplicatedResource,
    target: tuple[Literal["gpu", "mig"], str | None],
) -> tuple[SharedClass, FieldViolation]:
    """The DeviceClass of one valid resource, and the note of what its replicas became."""
    device_type, profile = target
    kind = dra_api.GPU_CONFIG if device_type == "gpu" else dra_api.MIG_CONFIG
    share: dict[str, Any] = {"strategy": _DRIVER_STRATEGY[strategy]}
    if strategy == "mps":
        pct = 100 // res.replicas
        share["mpsConfig"] = {"defaultActiveThreadPercentage": pct}
        note = FieldViolation(
            f"{at}.replicas",
            f"mapped to mpsConfig.defaultActiveThreadPercentage {pct} (100 / "
            f"{res.replicas}); the plugin's 1/{res.replicas} memory share is not set",
        )
    else:
        if device_type == "gpu":
            share["timeSlicingConfig"] = {"interval": "Default"}
        note = FieldViolation(
            f"{at}.replicas",
            "not carried: under DRA a claim's device is time-sliced among the pods and "
            f"containers that share the claim, however many; the driver has no count "
            f"({res.replicas} is not enforced)"
            + (
                "; on MIG devices the driver sets no time-slice interval"
                if device_type == "mig"
                else ""
            ),
        )
    parameters = {"apiVersion": dra_api.API_VERSION, "kind": kind, "sharing": share}
    return SharedClass(res.name, strategy, device_type, profile, parameters), note


def _device(resource: str) -> tuple[Literal["gpu", "mig"], str | None] | None:
    if resource == GPU_RESOURCE:
        return "gpu", None
    match = _MIG_RESOURCE.fullmatch(resource.removeprefix(RESOURCE_PREFIX))
    if not resource.startswith(RESOURCE_PREFIX) or match is None:
        return None
    rest = match["rest"]
    # nvidia.com/mig-1g.10gb.me is the profile 1g.10gb+me (advertise.mig_resource_name)
    profile = match["base"] + ("+" + rest[1:] if rest.startswith(".") else rest)
    return "mig", profile


# -- objects --------------------------------------------------------------------------------


def _selector(shared: SharedClass) -> str:
    attrs = f"device.attributes['{dra_api.DRIVER}']"
    expression = f"device.driver == '{dra_api.DRIVER}' && {attrs}.type == '{shared.device_type}'"
    if shared.profile is not None:
        expression += f" && {attrs}.profile == '{shared.profile}'"
    return expression


def _labels(shared: SharedClass) -> dict[str, str]:
    return {
        STRATEGY_LABEL: shared.strategy,
        RESOURCE_LABEL: shared.resource.removeprefix(RESOURCE_PREFIX),
    }


def class_spec(shared: SharedClass) -> dict[str, Any]:
    return {
        "selectors": [{"cel": {"expression": _selector(shared)}}],
        "config": [
            {"opaque": {"driver": dra_api.DRIVER, "parameters": copy.deepcopy(shared.parameters)}}
        ],
    }


def device_class(shared: SharedClass, *, rendered: bool = False) -> dict[str, Any]:
    """The DeviceClass for ``shared``: the agents', or, ``rendered``, for GitOps (no agent
    takes it for its own)."""
    labels = _labels(shared) | {(RENDERED_BY if rendered else MANAGED_BY): AGENT}
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {
            "name": shared.name,
            "labels": labels,
            "annotations": {RESOURCE_NAME: shared.resource},
        },
        "spec": class_spec(shared),
    }


def claim_template(shared: SharedClass, namespace: str) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for one device of the driver's own class with the
    sharing config in the claim (so it works without the agent's DeviceClass, and the driver's
    webhook, when deployed, validates it)."""
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS}
    if shared.profile is not None:
        exactly = {
            "deviceClassName": MIG_CLASS,
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.attributes['{dra_api.DRIVER}'].profile == "
                        f"'{shared.profile}'"
                    }
                }
            ],
        }
    labels = _labels(shared) | {RENDERED_BY: AGENT}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": shared.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {RESOURCE_NAME: shared.resource},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": REQUEST, "exactly": exactly}],
                    "config": [
                        {
                            "requests": [REQUEST],
                            "opaque": {
                                "driver": dra_api.DRIVER,
                                "parameters": copy.deepcopy(shared.parameters),
                            },
                        }
                    ],
                }
            }
        },
    }


def render(
    config: PluginConfig, allocation: Allocation, namespace: str | None = None
) -> list[dict[str, Any]]:
    """For GitOps: the DeviceClasses ``config`` renders and, given a namespace, a
    ResourceClaimTemplate per class, in a fixed order (same spec, same objects)."""
    shared = plan(config, allocation).classes
    objects = [device_class(s, rendered=True) for s in shared]
    if namespace is not None:
        objects += [claim_template(s, namespace) for s in shared]
    return objects


# -- creating the agent's DeviceClasses ---------------------------------------------------------

Action = Literal["create", "unchanged"]


@dataclass(frozen=True, slots=True)
class Change:
    """What to do with one DeviceClass: ``body`` is what to create, or what is there."""

    action: Action
    name: str
    body: Mapping[str, Any]


def owned(obj: Mapping[str, Any]) -> bool:
    return _meta(obj, "labels").get(MANAGED_BY) == AGENT


def _meta(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    found = meta.get(key) if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def same_spec(obj: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    have = obj.get("spec")
    have = have if isinstance(have, Mapping) else {}
    return all(have.get(key) == spec[key] for key in ("selectors", "config"))


def reconcile_one(name: str, desired: SharedClass, existing: Mapping[str, Any] | None) -> Change:
    """Create DeviceClass ``name`` when it is absent; one that is there is left as it is, since
    its name fixes its spec. Conflict when it is not the agent's, or was edited since."""
    if existing is None:
        return Change("create", name, device_class(desired))
    if not owned(existing):
        raise Conflict(
            f"DeviceClass {name} exists and is not managed by gpu-agent (no {MANAGED_BY}: "
            f"{AGENT} label); rename or remove it first"
        )
    if not same_spec(existing, class_spec(desired)):
        raise Conflict(
            f"DeviceClass {name} does not carry the spec its name stands for (edited since an "
            f"agent created it); no agent changes it: delete it (kubectl delete deviceclass "
            f"{name}) and run share set again"
        )
    return Change("unchanged", name, existing)


def _meta_value(obj: Mapping[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    return str(meta.get(key) or "") if isinstance(meta, Mapping) else ""


def reconcile(
    desired: Sequence[SharedClass], existing: Sequence[Mapping[str, Any]]
) -> list[Change]:
    """Every change, in name order, that makes the cluster hold the classes ``desired``, given
    those of them it holds (``existing``): the absent ones created, nothing else written. All
    or nothing: a Conflict on any refuses the whole change."""
    by_name = {_meta_value(obj, "name"): obj for obj in existing}
    return [
        reconcile_one(s.name, s, by_name.get(s.name)) for s in sorted(desired, key=lambda s: s.name)
    ]
