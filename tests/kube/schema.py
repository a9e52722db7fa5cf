"""The API stand-in held to the real schema: every object it serves and every body the agent
sends is validated against the Kubernetes OpenAPI schema (kubernetes-validate's, strict: an
unknown field or a wrong type is an error) of the versions the agent claims, ``VERSIONS``: the
oldest it supports (resource.k8s.io/v1 is GA in 1.34) and the newest the package knows.

What is checked: a POST or PUT body as the object it is; a merge or strategic-merge patch as
the partial object it is (deletions, ``null``, left out) and the object served after it (the
merged result); every reply and watch event object that has a schema (``Status`` replies have
none in the package, nor do objects the stand-in does not know). The metadata-only kinds
(meta.k8s.io PartialObjectMetadata and its List) are in no OpenAPI document: they are checked
as their Go types are, type fields and the strict ObjectMeta (ListMeta and items) schema. A
failure is recorded in ``FAILURES`` (never changes the answer: the real server drops unknown
fields with a warning), and the ``kube_api`` fixture fails the test that caused it
(tests/kube/fixtures.py).

What changes the answer, as the real server refuses it before storing anything
(tests/kube/fake_api.py answers it):
- a body's media type: a POST or PUT is ``application/json`` (or ``application/yaml``, of which
  JSON is a part; none sent is read as JSON), a PATCH one of the patch types
  (``PATCH_TYPES``); anything else is 415 UnsupportedMediaType;
- a time not in its wire format: the schema says only ``date-time`` for both, but a
  ``MicroTime`` (Lease acquireTime and renewTime, an Event's eventTime...) is decoded with Go's
  RFC3339Micro layout (exactly six fractional digits) and a ``Time`` with RFC3339; one that
  does not parse is a decoding error, 400 BadRequest (apiserver's ``transformDecodeError``).
  Found through the schema (``_TIMES``), so every such field of every kind is held to it.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from kubernetes_validate import utils as kubernetes_validate

#: resource.k8s.io/v1 is GA and v1alpha3 DeviceTaintRules served from Kubernetes 1.34.
VERSIONS = ("1.34.0", kubernetes_validate.all_versions()[-1])
#: one line per schema failure since the last ``take``
FAILURES: list[str] = []
_LOCK = threading.Lock()

_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d"
_ZONE = r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
#: the definitions the two time types have in the schema -> the layout Go parses them with
_TIMES = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": (
        "2006-01-02T15:04:05.000000Z07:00",
        f"^{_DATE}\\.\\d{{6}}{_ZONE}$",
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": (
        "2006-01-02T15:04:05Z07:00",
        f"^{_DATE}(\\.\\d+)?{_ZONE}$",
    ),
}
#: how a time that does not parse begins its problem (it is refused, not only recorded)
UNPARSED = "parsing time"
#: the patch types the server takes for the built-in kinds (a CRD: all but strategic-merge)
PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
)
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

#: path prefix (after the version) -> (apiVersion, kind) of the object a POST/PUT/PATCH names
KINDS = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
    "configmaps": ("v1", "ConfigMap"),
    "leases": ("coordination.k8s.io/v1", "Lease"),
    "eviction": ("policy/v1", "Eviction"),
    "resourceslices": ("resource.k8s.io/v1", "ResourceSlice"),
    "resourceclaims": ("resource.k8s.io/v1", "ResourceClaim"),
    "resourceclaimtemplates": ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    "deviceclasses": ("resource.k8s.io/v1", "DeviceClass"),
    "devicetaintrules": ("resource.k8s.io/v1alpha3", "DeviceTaintRule"),
}


#: discovery documents (/apis, /apis/<group>, /apis/<group>/<version>)
DISCOVERY = {"APIGroupList", "APIGroup", "APIResourceList", "APIVersions"}


def label_problem(key: str, value: str) -> str | None:
    """Why the API server refuses this label (its validation rules), or None."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS.match(prefix)):
        return f"{key}: prefix part must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return f"{key}: name part must be <= 63 characters of [A-Za-z0-9._-], alphanumeric ends"
    if len(value) > 63 or not _NAME.match(value):
        return f"{key}={value}: a label value must be <= 63 characters of [A-Za-z0-9._-]"
    return None


#: a Node taint's effects (core/v1 TaintEffect; a DeviceTaintRule's differ)
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint_problems(taints: object) -> list[str]:
    """Why the API server refuses a Node's ``spec.taints`` (its validateNodeTaints): 422."""
    if taints is None:
        return []
    if not isinstance(taints, list):
        return ["spec.taints: must be a list"]
    found, seen = [], set()
    for i, taint in enumerate(taints):
        taint = taint if isinstance(taint, dict) else {}
        key, value, effect = taint.get("key"), taint.get("value", ""), taint.get("effect")
        where = f"spec.taints[{i}]"
        if not isinstance(key, str) or not key:
            found.append(f"{where}.key: Required value")
        elif problem := label_problem(key, ""):
            found.append(f"{where}.key: Invalid value: {problem}")
        if not isinstance(value, str) or (problem := label_problem("v", value)):
            found.append(f"{where}.value: Invalid value: {value!r}: a label value")
        if not effect:
            found.append(f"{where}.effect: Required value")
        elif effect not in TAINT_EFFECTS:
            wanted = ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            found.append(
                f"{where}.effect: Unsupported value: {effect!r}: supported values: {wanted}"
            )
        if (key, effect) in seen:
            found.append(f"{where}: Duplicate value: taints must be unique by key and effect pair")
        seen.add((key, effect))
    return found


@functools.cache
def _validator(api_version: str, kind: str, version: str) -> Any:
    """The strict schema's validator, or None where the package has no schema for it."""
    import jsonschema
    from referencing import Registry, Resource

    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    if kind in DISCOVERY:
        group = "meta-v1"  # discovery documents are meta/v1 types served as apiVersion v1
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = kubernetes_validate.schema_contents(
            f"{folder}/{kind.lower()}-{group}.json", version
        )
    except FileNotFoundError:
        return None
    defs = kubernetes_validate.schema_contents(f"{folder}/_definitions.json", version)
    defs = {**defs, "$defs": dict(defs["$defs"])}  # the package's cached copy stays as it is
    for name, (layout, pattern) in _TIMES.items():
        # What Go parses, in place of "date-time" (which the validator does not check).
        defs["$defs"][name] = {"type": ["string", "null"], "pattern": pattern, "layout": layout}
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def problems(obj: object) -> list[str]:
    """Why the real schema refuses ``obj`` (a whole object with apiVersion and kind)."""
    if not isinstance(obj, dict):
        return [f"not an object: {type(obj).__name__}"]
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not api_version or not kind:
        return [f"{kind or '?'} with no apiVersion or kind"]
    if kind == "Status":
        return []  # the package has Status only as meta/v1; its shape is _status's
    if kind in PARTIAL and api_version in (f"meta.k8s.io/{v}" for v in ("v1", "v1beta1")):
        return _partial_problems(obj)
    validators = [(v, _validator(str(api_version), str(kind), v)) for v in VERSIONS]
    if all(validator is None for _, validator in validators):
        return [f"{api_version} {kind}: no such kind in Kubernetes {' or '.join(VERSIONS)}"]
    found = []
    for version, validator in validators:
        if validator is None:
            continue  # newer than this version (DeviceTaintRule v1beta2: served from 1.36)
        for e in validator.iter_errors(obj):
            where = "/".join(str(p) for p in e.absolute_path)
            layout = (
                isinstance(e.schema, dict) and e.validator == "pattern" and e.schema.get("layout")
            )
            if layout:
                found.append(f"{UNPARSED} {kind} {where} {e.instance!r} as {layout!r} ({version})")
            else:
                found.append(f"{kind} {where} ({version}): {e.message[:300]}")
    return found


#: the metadata-only kinds: (the metadata's schema, the fields beside apiVersion and kind)
PARTIAL = {
    "PartialObjectMetadata": ("ObjectMeta", {"metadata"}),
    "PartialObjectMetadataList": ("ListMeta", {"metadata", "items"}),
}


def _partial_problems(obj: dict[str, Any]) -> list[str]:
    """A PartialObjectMetadata(List) against its Go type: TypeMeta, ObjectMeta (ListMeta and
    ``items`` of PartialObjectMetadata of the same apiVersion) and nothing else."""
    kind, api_version = str(obj["kind"]), str(obj["apiVersion"])
    meta, fields = PARTIAL[kind]
    found = [
        f"{kind}: {k!r} was unexpected" for k in obj if k not in {"apiVersion", "kind", *fields}
    ]
    for version in VERSIONS:
        validator = _validator("meta.k8s.io/v1", meta, version)
        errors = validator.iter_errors(obj.get("metadata") or {})
        found += [f"{kind} metadata ({version}): {e.message[:300]}" for e in errors]
    if kind == "PartialObjectMetadataList":
        items = obj.get("items")
        if not isinstance(items, list):
            return [*found, f"{kind}: items is required, a list"]
        for item in items:
            typed = isinstance(item, dict) and (item.get("apiVersion"), item.get("kind"))
            if typed != (api_version, "PartialObjectMetadata"):
                found.append(f"{kind} items: {typed or 'not an object'}, not its item kind")
            else:
                found += _partial_problems(item)
    return found


def _record(where: str, found: list[str]) -> None:
    if found:
        with _LOCK:
            FAILURES.extend(f"{where}: {p}" for p in found)


def take() -> list[str]:
    """The failures recorded so far, cleared."""
    with _LOCK:
        found = FAILURES[:]
        FAILURES.clear()
        return found


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def unsupported_media(method: str, parts: list[str], content_type: str) -> str | None:
    """Why the real server answers 415 to a write of this media type, or None."""
    if method not in ("POST", "PUT", "PATCH") or not any(p in KINDS for p in parts):
        return None
    media = content_type.partition(";")[0].strip().lower()
    if method == "PATCH":
        taken: tuple[str, ...] = PATCH_TYPES
    else:
        taken = ("application/json", "application/yaml")
        media = media or "application/json"  # none sent: the server reads JSON
    if media in taken:
        return None
    accepted = ", ".join(taken)
    return (
        "the body of the request was in an unknown format - accepted media types include: "
        f'{accepted} (sent "{content_type}")'
    )


def check_request(method: str, parts: list[str], content_type: str, body: object) -> str | None:
    """A body the agent sent, against the schema of the object its path names: failures are
    recorded; a time that does not parse is returned (the server's 400), not recorded."""
    if method not in ("POST", "PUT", "PATCH") or body is None:
        return None
    names = [p for p in parts if p in KINDS]
    if not names:
        return None
    api_version, kind = KINDS[names[-1]]
    group = api_version.rpartition("/")[0]
    if parts[:2] == ["apis", group] and len(parts) > 2:
        api_version = f"{group}/{parts[2]}"  # the version the path names (DeviceTaintRules: two)
    where = f"{method} /{'/'.join(parts)}"
    if not isinstance(body, dict):
        _record(where, ["the body is not an object"])
        return None
    if method == "PATCH":
        if "json-patch" in content_type:
            return None  # an RFC 6902 list of operations: nothing of the object's shape
        kept: dict[str, Any] = _without_nulls(body)  # a merge patch's null deletes
        body = {**kept, "metadata": dict(kept.get("metadata") or {}, name="patched")}
    found = problems({"apiVersion": api_version, "kind": kind, **body})
    _record(where, [p for p in found if not p.startswith(UNPARSED)])
    if body.get("apiVersion", api_version) != api_version or body.get("kind", kind) != kind:
        _record(where, [f"sent {body.get('apiVersion')} {body.get('kind')} to {kind}'s path"])
    unparsed = sorted({p.rpartition(" (")[0] for p in found if p.startswith(UNPARSED)})
    if unparsed:
        version = api_version.rpartition("/")[2]
        return f'{kind} in version "{version}" cannot be handled as a {kind}: {"; ".join(unparsed)}'
    return None


def check_reply(code: int, obj: object, where: str) -> None:
    """An object the stand-in serves (a reply, a list, a watch event's object)."""
    if code < 300 and isinstance(obj, dict):
        _record(f"served by {where}", problems(obj))
