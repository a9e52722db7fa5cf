"""PrewarmService on the wire: targets, cache items and the cache's usage.

Servicers parse targets with `prewarm_requests_from` (raising `InvalidSpec` naming the request
field) and answer with the ``*_pb`` functions; clients turn answers back into records with the
``*_from`` ones, and say what to warm with `prewarm_targets_pb`, the parser inverted.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from agent._proto.gpuagent.v1 import cache_pb2, prewarm_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.budget import Usage
from agent.prewarm.kinds import source_for
from agent.prewarm.model import (
    CacheItem,
    ImageWarmth,
    ItemState,
    PullPolicy,
    Warmth,
    item_kind,
)
from agent.prewarm.source import SourceRequest
from agent.prewarm.target import FieldType, TargetSchema
from agent.redact import redact_text
from agent.wire.timestamps import seconds, timestamp

__all__ = [
    "NOT_CARRIED",
    "TARGET_MESSAGES",
    "UNKNOWN_KIND",
    "CacheContents",
    "ItemStatus",
    "cache_contents_from",
    "cache_inventory_pb",
    "cache_item_from",
    "cache_item_pb",
    "item_state_pb",
    "item_status_from",
    "message_values",
    "prewarm_requests_from",
    "prewarm_targets_pb",
    "target_pb",
    "target_request",
]


#: `CacheItem` fields the API does not carry (when a fetch started, who asked for it): a client's
#: copy has them None, which would read as "unknown" or "nobody" where the agent knows.
NOT_CARRIED = frozenset({"started_at", "owner", "owner_role"})

#: kind -> the API's CACHE_ITEM_KIND_<KIND>; a kind the API does not name yet shows as
#: UNSPECIFIED (a new kind adds its value to cache.proto to be named)
_KINDS: dict[str, cache_pb2.CacheItemKind] = {
    name.removeprefix("CACHE_ITEM_KIND_").lower(): cast(cache_pb2.CacheItemKind, value)
    for name, value in cache_pb2.CacheItemKind.items()
    if value != cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED
}
_KINDS_FROM = {value: item_kind(kind) for kind, value in _KINDS.items()}
#: what a client reads for a kind the API does not name (UNSPECIFIED: a kind registered beyond
#: cache.proto's) or that it does not know (a newer agent's)
UNKNOWN_KIND = "unknown"
_STATES: dict[ItemState, cache_pb2.CacheItemState] = {
    ItemState.QUEUED: cache_pb2.CACHE_ITEM_STATE_QUEUED,
    ItemState.FETCHING: cache_pb2.CACHE_ITEM_STATE_FETCHING,
    ItemState.READY: cache_pb2.CACHE_ITEM_STATE_READY,
    ItemState.FAILED: cache_pb2.CACHE_ITEM_STATE_FAILED,
    ItemState.EVICTED: cache_pb2.CACHE_ITEM_STATE_EVICTED,
}


def item_state_pb(state: ItemState) -> cache_pb2.CacheItemState:
    return _STATES.get(state, cache_pb2.CACHE_ITEM_STATE_UNSPECIFIED)


_WARMTH: dict[Warmth, cache_pb2.ImageWarmthLevel] = {
    Warmth.FULL: cache_pb2.IMAGE_WARMTH_LEVEL_FULL,
    Warmth.PARTIAL: cache_pb2.IMAGE_WARMTH_LEVEL_PARTIAL,
    Warmth.BOOTSTRAP_ONLY: cache_pb2.IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY,
    Warmth.UNKNOWN: cache_pb2.IMAGE_WARMTH_LEVEL_UNKNOWN,
}


def image_warmth_pb(w: ImageWarmth) -> cache_pb2.ImageWarmth:
    return cache_pb2.ImageWarmth(
        level=_WARMTH[w.warmth],
        lazy=w.lazy,
        blobs_total=max(w.blobs_total, 0),
        blobs_warm=max(w.blobs_warm, 0),
        bytes_total=max(w.bytes_total, 0),
        bytes_warm=max(w.bytes_warm, 0),
    )


_PRIVATE_OPTION = "header:"  # where a request's secrets are read from: not for readers


def _source_pb(i: CacheItem) -> str:
    """An item's source as readers see it, as its kind says (agent/prewarm/source.py): a URL
    redacted (`redact_url`), an image reference whole (it has no query or user info)."""
    return source_for(i.kind).describe(i)


def cache_item_pb(i: CacheItem) -> cache_pb2.CacheItem:
    """An item as every reader sees it: no credential (source and error redacted, no header
    file paths), so it may go into replies, stored operation results and events alike."""
    item = cache_pb2.CacheItem(
        id=i.id,
        kind=_KINDS.get(i.kind, cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED),
        name=i.name,
        source=_source_pb(i),
        state=item_state_pb(i.state),
        pinned=i.pinned,
        size_bytes=i.size,
        sha256=i.sha256 or "",
        expected_sha256=i.expected_sha256 or "",
        fetched_bytes=max(i.fetched_bytes, 0),
        hits=max(i.hits, 0),
        error=redact_text(i.error or ""),
        warm_seconds=i.warm_seconds,
        create_time=timestamp(i.created_at),
        options={k: v for k, v in i.options.items() if not k.startswith(_PRIVATE_OPTION)},
    )
    if i.finished_at is not None:
        item.finish_time.CopyFrom(timestamp(i.finished_at))
    if i.last_used is not None:
        item.last_use_time.CopyFrom(timestamp(i.last_used))
    if i.image_warmth is not None:
        item.image_warmth.CopyFrom(image_warmth_pb(i.image_warmth))
    return item


_STATES_FROM = {pb: state for state, pb in _STATES.items()}


def cache_usage_pb(u: Usage) -> cache_pb2.CacheUsage:
    return cache_pb2.CacheUsage(
        used_bytes=max(u.used_bytes, 0),
        reserved_bytes=max(u.reserved_bytes, 0),
        pinned_bytes=max(u.pinned_bytes, 0),
        capacity_bytes=max(u.capacity_bytes, 0),
        budget_bytes=max(u.budget_bytes, 0),
        volume_bytes=max(u.volume_bytes, 0),
    )


def cache_inventory_pb(usage: Usage, items: Iterable[CacheItem]) -> cache_pb2.CacheInventory:
    return cache_pb2.CacheInventory(
        usage=cache_usage_pb(usage), items=[cache_item_pb(i) for i in items]
    )


def at(where: str, name: str) -> str:
    """A violation's field: ``name`` under ``where`` ("" for none)."""
    return f"{where}.{name}" if where else name


def message_values(
    schema: TargetSchema, msg: Any, where: str, bad: list[FieldViolation]
) -> dict[str, Any]:
    """A target message's fields (prewarm.proto's FileTarget, ImageTarget, ...) as its
    schema's values (agent/prewarm/target.py), for the API and the coordinator alike: proto3's
    empty values read as absent; the checks a message's types cannot make (a source given,
    hours in range, header files as absolute paths) go to ``bad``."""
    if not getattr(msg, schema.source):
        bad.append(FieldViolation(at(where, schema.source), "required"))
    values: dict[str, Any] = {}
    for name, kind in schema.fields.items():
        value = getattr(msg, name)
        if kind is FieldType.TEXT:
            values[name] = value or None
        elif kind is FieldType.HOURS:
            values[name] = value if msg.HasField(name) else None
            # The upper bound is the kind's own (its check names it), not a second one here.
            if values[name] is not None and not (math.isfinite(value) and value > 0):
                bad.append(FieldViolation(at(where, name), "a finite number of hours, more than 0"))
        elif kind is FieldType.PULL_POLICY:
            values[name] = _member(msg.DESCRIPTOR.fields_by_name[name], value, PullPolicy)
        elif kind is FieldType.HEADERS:
            values[name] = _absolute_headers(value, at(where, name), bad)
        elif kind is FieldType.GLOBS:
            values[name] = list(value)
        else:
            values[name] = bool(value)
    return values


def _member(field: Any, number: int, members: type[enum.Enum]) -> str | None:
    """An enum field's number as the member of ``members`` its value is named after
    (IMAGE_PULL_POLICY_ALWAYS: ALWAYS); None for UNSPECIFIED or an unknown number, which read
    as the default."""
    value = field.enum_type.values_by_number.get(number)  # a number this agent does not know
    name = value.name if value is not None and number else ""
    found = [m.value for m in members if name.endswith(f"_{m.name}")]
    return found[0] if found else None


def _number(field: Any, value: str | None, members: type[enum.Enum]) -> int:
    """`_member` inverted (None: UNSPECIFIED)."""
    if value is None:
        return 0
    suffix = f"_{members(value).name}"
    return next(v.number for v in field.enum_type.values if v.name.endswith(suffix))


def _absolute_headers(
    header_files: Mapping[str, str], where: str, bad: list[FieldViolation]
) -> dict[str, Path]:
    """A header mapping field (at ``where``) whose paths must be absolute on the node."""
    headers = {}
    for name, path in header_files.items():
        if not path or not Path(path).is_absolute():
            bad.append(FieldViolation(f"{where}[{name}]", "must be an absolute path on the node"))
        headers[name] = Path(path)
    return headers


_MAXTARGET_MESSAGES = 1000


def target_request(
    target: prewarm_pb2.PrewarmTarget, where: str, bad: list[FieldViolation]
) -> SourceRequest | None:
    """One target as its kind's request, read by its target schema (agent/prewarm/target.py);
    None with what is wrong added to ``bad``, each at ``<where>.<kind>.<field>``."""
    which = target.WhichOneof("target")
    schema = kinds.schema_for(which) if which else None
    if schema is None:
        names = [s.kind for s in kinds.schemas()]
        bad.append(FieldViolation(where, f"set {', '.join(names[:-1])} or {names[-1]}"))
        return None
    assert which is not None
    before = len(bad)
    values = message_values(schema, getattr(target, which), f"{where}.{which}", bad)
    return schema.build(values) if len(bad) == before else None


def prewarm_requests_from(targets: Sequence[prewarm_pb2.PrewarmTarget]) -> list[SourceRequest]:
    """The request's targets as prewarm requests (`target_request`); shape errors name
    ``targets[i].<kind>.<field>``."""
    if not 1 <= len(targets) <= _MAXTARGET_MESSAGES:
        raise InvalidSpec(
            f"a prewarm needs 1 to {_MAXTARGET_MESSAGES} targets, got {len(targets)}",
            [FieldViolation("targets", f"give 1 to {_MAXTARGET_MESSAGES} targets")],
        )
    bad: list[FieldViolation] = []
    requests = [target_request(t, f"targets[{i}]", bad) for i, t in enumerate(targets)]
    if bad:
        raise InvalidSpec("the prewarm request is malformed", bad)
    return [r for r in requests if r is not None]


def target_pb(schema: TargetSchema, values: Mapping[str, Any]) -> prewarm_pb2.PrewarmTarget:
    """A target of ``schema``'s kind from ``values`` by API name (absent or None: unset), each
    field converted by its type and the message's descriptor: `message_values` inverted."""
    message = TARGET_MESSAGES[schema.kind]
    fields: dict[str, Any] = {}
    for name, kind in schema.fields.items():
        value = values.get(name)
        if kind is FieldType.PULL_POLICY:
            descriptor = message.DESCRIPTOR.fields_by_name[name]
            fields[name] = _number(descriptor, value, PullPolicy)
        elif kind is FieldType.TEXT:
            fields[name] = value or ""
        elif value is not None:
            fields[name] = value
    return prewarm_pb2.PrewarmTarget(**{schema.kind: message(**fields)})


def prewarm_targets_pb(requests: Iterable[SourceRequest]) -> list[prewarm_pb2.PrewarmTarget]:
    """Requests (a manifest's, a command's) as the API's targets: `prewarm_requests_from`
    inverted, so a client says exactly what the agent will read back."""
    targets = []
    for r in requests:
        schema = kinds.for_request(r).schema
        if schema is None or schema.kind not in TARGET_MESSAGES:
            raise InvalidSpec(f"a {kinds.for_request(r).kind} request has no API target")
        targets.append(target_pb(schema, schema.values(r)))
    return targets


#: PrewarmTarget's oneof field (file, image, model, ...) -> its kind's message class
TARGET_MESSAGES: dict[str, Any] = {
    f.name: getattr(prewarm_pb2, f.message_type.name)
    for f in prewarm_pb2.PrewarmTarget.DESCRIPTOR.oneofs_by_name["target"].fields
    if f.message_type is not None
}


def cache_item_from(pb: cache_pb2.CacheItem) -> CacheItem:
    """`cache_item_pb` inverted, for a client that renders items (round trip tested); an
    image's warmth travels in its options, as the agent keeps it. A kind or state this client
    does not know (UNSPECIFIED, or a newer agent's value) reads as `UNKNOWN_KIND` or
    `ItemState.UNKNOWN`, never as an error."""
    return CacheItem(
        id=pb.id,
        kind=_KINDS_FROM.get(pb.kind, UNKNOWN_KIND),
        name=pb.name,
        source=pb.source,
        state=_STATES_FROM.get(pb.state, ItemState.UNKNOWN),
        pinned=pb.pinned,
        size=pb.size_bytes if pb.HasField("size_bytes") else None,
        sha256=pb.sha256 or None,
        expected_sha256=pb.expected_sha256 or None,
        fetched_bytes=pb.fetched_bytes,
        created_at=seconds(pb.create_time) or 0.0,
        finished_at=seconds(pb.finish_time) if pb.HasField("finish_time") else None,
        last_used=seconds(pb.last_use_time) if pb.HasField("last_use_time") else None,
        hits=pb.hits,
        error=pb.error or None,
        warm_seconds=pb.warm_seconds if pb.HasField("warm_seconds") else None,
        options=dict(pb.options),
    )


@dataclass(frozen=True, slots=True)
class ItemStatus:
    """How far a cache item got, as a rollout weighs it (GetNode's cache, a prewarm's result)."""

    name: str
    ready: bool
    #: why it failed ("" when it did not)
    error: str
    #: an image's warmth (full, partial, bootstrap-only, unknown, unspecified); None when the
    #: agent reports none (a file, or an agent from before image warmth)
    warmth: str | None
    #: its kind (file, image, group; `UNKNOWN_KIND` for one this client does not know)
    kind: str = UNKNOWN_KIND
    #: its source as readers see it (a URL without query or user info, an image reference)
    source: str = ""
    #: the digest of its content, and the one its request pinned ("" when none)
    sha256: str = ""
    expected_sha256: str = ""
    #: what its last run recorded, as the node shows it (a model's repo, revision, include);
    #: empty from an agent that sends none
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def warm(self) -> bool:
        """Ready, and for an image all of its data (a bootstrap-only Nydus image is not
        warm). Agents from before image warmth send none: their ready images count."""
        return self.ready and (self.warmth is None or self.warmth == "full")

    @property
    def warmth_word(self) -> str:
        """The warmth as shown ("unspecified" when none was reported)."""
        return self.warmth if self.warmth is not None else _warmth_word(0)


def _warmth_word(level: int) -> str:
    name = cache_pb2.ImageWarmthLevel.Name(cast(cache_pb2.ImageWarmthLevel, level))
    return name.removeprefix("IMAGE_WARMTH_LEVEL_").lower().replace("_", "-")


def item_status_from(pb: cache_pb2.CacheItem) -> ItemStatus:
    warmth = _warmth_word(pb.image_warmth.level) if pb.HasField("image_warmth") else None
    return ItemStatus(
        pb.name,
        pb.state == cache_pb2.CACHE_ITEM_STATE_READY,
        pb.error,
        warmth,
        kind=_KINDS_FROM.get(pb.kind, UNKNOWN_KIND),
        source=pb.source,
        sha256=pb.sha256,
        expected_sha256=pb.expected_sha256,
        options=dict(pb.options),
    )


@dataclass(frozen=True, slots=True)
class CacheContents:
    """The cache as ListCache tells it: its usage and its ready items."""

    usage: Usage
    items: tuple[CacheItem, ...]


def cache_contents_from(pb: cache_pb2.CacheInventory) -> CacheContents:
    """`cache_inventory_pb` inverted, for a client that renders the cache."""
    u = pb.usage
    usage = Usage(
        used_bytes=u.used_bytes,
        reserved_bytes=u.reserved_bytes,
        pinned_bytes=u.pinned_bytes,
        capacity_bytes=u.capacity_bytes,
        budget_bytes=u.budget_bytes,
        volume_bytes=u.volume_bytes,
    )
    return CacheContents(usage, tuple(cache_item_from(i) for i in pb.items))
