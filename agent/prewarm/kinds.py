"""The registry of prewarm source kinds: the one place a kind is made known.

Each kind is one `Source` (agent/prewarm/source.py) in its own module,
``agent/prewarm/source_<kind>.py``, which names it ``SOURCE``: this registry finds those
modules by name and registers each, so a new kind is its module alone. Registered, it is all
the service, the store, the inventory, the manifest, the API's conversion, the coordinator's
checks and both CLIs' commands need to handle its items. The records (agent/prewarm/model.py)
know no kinds: what depends on an item's kind is asked here (`layout_of`, `label_ready`), and
the store, below this registry (a kind's module imports it), is given `layout_of` when it is
built. A test registers a kind of its own with `register` (or `registered`) and drops it with
`unregister`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager

from agent.errors import InvalidSpec, NotSupported
from agent.prewarm.model import CacheItem, Layout
from agent.prewarm.source import Source, SourceRequest
from agent.prewarm.target import TargetSchema

_BY_KIND: dict[str, Source] = {}
_BY_REQUEST: dict[type, Source] = {}


def register(source: Source) -> None:
    """Make ``source``'s kind known; a kind or request type registered twice is refused."""
    if source.kind in _BY_KIND or source.request_type in _BY_REQUEST:
        raise ValueError(f"prewarm kind {source.kind!r} is already registered")
    _BY_KIND[source.kind] = source
    _BY_REQUEST[source.request_type] = source


def unregister(kind: str) -> None:
    source = _BY_KIND.pop(kind)
    del _BY_REQUEST[source.request_type]


@contextmanager
def registered(source: Source) -> Iterator[Source]:
    """``source`` registered for the block (a test's own kind)."""
    register(source)
    try:
        yield source
    finally:
        unregister(source.kind)


def source_for(kind: str) -> Source:
    """The `Source` of a stored item's kind."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise NotSupported(f"prewarm kind {kind!r} is not known to this agent") from None


def layout_of(kind: str) -> Layout:
    """Where a stored item's kind keeps a ready item (its `Source` says)."""
    return source_for(kind).layout


def label_ready(item: CacheItem) -> bool:
    """Worth a ``cache.<name>=ready`` node label: ready, and as its kind's `Source.ready`
    says (a Nydus image with only its bootstrap pulled would still fetch its data when the
    pod starts)."""
    return source_for(item.kind).ready(item)


def for_request(request: SourceRequest) -> Source:
    """The `Source` that takes ``request``."""
    try:
        return _BY_REQUEST[type(request)]
    except KeyError:
        raise InvalidSpec(f"not a prewarm request: {type(request).__name__}") from None


def schemas() -> list[TargetSchema]:
    """The target schemas of the registered kinds that have one, in registration order."""
    return [s.schema for s in _BY_KIND.values() if s.schema is not None]


def schema_for(target_kind: str) -> TargetSchema | None:
    """The schema whose ``kind`` (the API's target field: file, image, model) is given."""
    return next((s for s in schemas() if s.kind == target_kind), None)


def kinds() -> list[str]:
    """The registered kinds, in registration order (modules by name, then tests' own)."""
    return list(_BY_KIND)


def _discover() -> None:
    """Register the ``SOURCE`` of every ``source_<kind>`` module of this package, by name."""
    package = importlib.import_module("agent.prewarm")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("source_"):
            register(importlib.import_module(f"agent.prewarm.{info.name}").SOURCE)


_discover()
