"""The ``resource.k8s.io/v1`` part of the API stand-in: ResourceSlice, DeviceClass (cluster
scoped), ResourceClaim and ResourceClaimTemplate (namespaced), as Kubernetes 1.34+ serves them.

Written from the API reference (kubernetes.io/docs/reference/kubernetes-api/workload-resources/
resource-slice-v1, device-class-v1, resource-claim-v1, resource-claim-template-v1) and the
validation in k8s.io/kubernetes pkg/apis/resource/validation, reduced to the rules a client of
ours can break:

- only ``v1`` is served here (a 1.34 cluster may also serve v1beta1/v1beta2; clients that try
  v1 first must not need them): other versions answer 404;
- a ResourceSlice needs ``spec.driver`` (a DNS subdomain of at most 63 characters),
  ``spec.pool.name``, ``spec.pool.generation`` >= 0, ``spec.pool.resourceSliceCount`` >= 1, and
  exactly one of ``nodeName``, ``nodeSelector``, ``allNodes``, ``perDeviceNodeSelection``; at
  most 128 devices, each named by a DNS label, unique in the slice, with at most 32 attributes
  and capacities together, each attribute exactly one of bool/int/string/version;
- ``spec.nodeName`` and ``spec.driver`` are the field selectors the server offers on slices
  (``spec.nodeName=`` / ``spec.driver=``), ``status.allocation`` is the claims' allocation;
- a ResourceClaim's ``spec.devices.requests[*]`` each have a DNS-label ``name`` and exactly one
  of ``exactly`` (a ``deviceClassName``) or ``firstAvailable``; ``spec`` is immutable after
  create (422), ``status`` is written through the ``/status`` subresource only (PUT there
  changes status and nothing else, PUT on the object keeps the stored status);
- a DeviceClass has ``spec`` with optional ``selectors`` and ``config``; config entries carry
  ``opaque.driver`` and ``opaque.parameters`` (any JSON object, the driver validates it);
- every write bumps the cluster-wide resourceVersion and is seen by ``?watch=1`` on the list.

Not modelled: the scheduler (nothing allocates a claim unless a test writes its status), CEL
selectors (kept, never evaluated), admin access, device taint rules, partitionable counters'
arithmetic, and ``resourceVersionMatch``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

GROUP = "resource.k8s.io"
VERSION = "v1"
#: resource -> (kind, namespaced)
RESOURCES: dict[str, tuple[str, bool]] = {
    "resourceslices": ("ResourceSlice", False),
    "deviceclasses": ("DeviceClass", False),
    "resourceclaims": ("ResourceClaim", True),
    "resourceclaimtemplates": ("ResourceClaimTemplate", True),
}
MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ATTRIBUTE_KINDS = ("bool", "int", "string", "version")


def invalid(kind: str, obj: dict[str, Any]) -> list[str]:
    """The server's validation errors for a create or update of ``obj`` (empty: valid)."""
    name = (obj.get("metadata") or {}).get("name")
    errors: list[str] = []
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: Required value")
    spec = obj.get("spec")
    if kind == "ResourceSlice":
        errors += _slice_errors(spec)
    elif kind == "ResourceClaim":
        errors += _claim_spec_errors(spec)
    elif kind == "ResourceClaimTemplate":
        inner = spec.get("spec") if isinstance(spec, dict) else None
        errors += [f"spec.{e}" for e in _claim_spec_errors(inner)]
    elif kind == "DeviceClass":
        errors += _class_errors(spec)
    return errors


def _slice_errors(spec: object) -> list[str]:
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    errors = []
    driver = spec.get("driver")
    if not isinstance(driver, str) or len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        errors.append("spec.driver: must be a DNS subdomain of at most 63 characters")
    pool = spec.get("pool")
    if not isinstance(pool, dict) or not isinstance(pool.get("name"), str) or not pool["name"]:
        errors.append("spec.pool.name: Required value")
    else:
        generation = pool.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            errors.append("spec.pool.generation: must be greater than or equal to 0")
        count = pool.get("resourceSliceCount")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            errors.append("spec.pool.resourceSliceCount: must be greater than or equal to 1")
    chosen = [
        k
        for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(k) not in (None, False, "")
    ]
    if len(chosen) != 1:
        errors.append(
            "spec: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            f"`perDeviceNodeSelection` is required (got {chosen or 'none'})"
        )
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        return [*errors, "spec.devices: must be a list"]
    if len(devices) > MAX_DEVICES_PER_SLICE:
        errors.append(
            f"spec.devices: Too many: {len(devices)}: must have at most "
            f"{MAX_DEVICES_PER_SLICE} items"
        )
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        if not isinstance(device, dict):
            errors.append(f"{where}: must be an object")
            continue
        name = device.get("name")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
            errors.append(f"{where}.name: must be a DNS label")
        elif name in seen:
            errors.append(f"{where}.name: Duplicate value: {name!r}")
        else:
            seen.add(name)
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        if not isinstance(attributes, dict) or not isinstance(capacity, dict):
            errors.append(f"{where}: attributes and capacity must be maps")
            continue
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            errors.append(
                f"{where}: Too many: attributes and capacities must have at most "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES} entries"
            )
        for key, value in attributes.items():
            kinds = [k for k in _ATTRIBUTE_KINDS if isinstance(value, dict) and k in value]
            if len(kinds) != 1:
                errors.append(f"{where}.attributes[{key}]: exactly one value must be specified")
        for key, value in capacity.items():
            if not isinstance(value, dict) or not isinstance(value.get("value"), str | int):
                errors.append(f"{where}.capacity[{key}].value: Required value")
    return errors


def _claim_spec_errors(spec: object) -> list[str]:
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or [] if isinstance(devices, dict) else None
    if not isinstance(requests, list):
        return ["spec.devices.requests: must be a list"]
    errors = []
    names: set[str] = set()
    for i, request in enumerate(requests):
        where = f"spec.devices.requests[{i}]"
        if not isinstance(request, dict):
            errors.append(f"{where}: must be an object")
            continue
        name = request.get("name")
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            errors.append(f"{where}.name: must be a DNS label")
        elif name in names:
            errors.append(f"{where}.name: Duplicate value: {name!r}")
        else:
            names.add(name)
        exactly = request.get("exactly")
        first = request.get("firstAvailable")
        if (exactly is None) == (first is None):
            errors.append(f"{where}: exactly one of `exactly` or `firstAvailable` is required")
        elif isinstance(exactly, dict) and not exactly.get("deviceClassName"):
            errors.append(f"{where}.exactly.deviceClassName: Required value")
    for i, entry in enumerate(devices.get("config") or [] if isinstance(devices, dict) else []):
        errors += [f"spec.devices.config[{i}].{e}" for e in _opaque_errors(entry)]
    return errors


def _class_errors(spec: object) -> list[str]:
    if spec is None:
        return []
    if not isinstance(spec, dict):
        return ["spec: must be an object"]
    errors = []
    for i, entry in enumerate(spec.get("config") or []):
        errors += [f"spec.config[{i}].{e}" for e in _opaque_errors(entry)]
    return errors


def _opaque_errors(entry: object) -> list[str]:
    opaque = entry.get("opaque") if isinstance(entry, dict) else None
    if not isinstance(opaque, dict):
        return ["opaque: Required value"]
    errors = []
    driver = opaque.get("driver")
    if not isinstance(driver, str) or len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        errors.append("opaque.driver: must be a DNS subdomain of at most 63 characters")
    if not isinstance(opaque.get("parameters"), dict):
        errors.append("opaque.parameters: Required value")
    return errors


def field_selected(resource: str, obj: dict[str, Any], selector: str) -> bool:
    """Whether ``obj`` passes a ``fieldSelector`` of ``k=v`` terms the server supports."""
    for term in filter(None, selector.split(",")):
        key, _, want = term.partition("=")
        if key == "metadata.name":
            got = (obj.get("metadata") or {}).get("name")
        elif key == "metadata.namespace":
            got = (obj.get("metadata") or {}).get("namespace")
        elif resource == "resourceslices" and key in ("spec.nodeName", "spec.driver"):
            got = (obj.get("spec") or {}).get(key.split(".", 1)[1])
        else:
            raise ValueError(f'field label not supported: "{key}"')
        if (got or "") != want:
            return False
    return True


def keep_status(stored: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A PUT on the object itself: its status is the stored one (status is a subresource)."""
    out = copy.deepcopy(new)
    out.pop("status", None)
    if stored is not None and "status" in stored:
        out["status"] = copy.deepcopy(stored["status"])
    return out
