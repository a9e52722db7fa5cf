"""Node selectors: ``key=value,key!=value`` over node facts and Kubernetes node labels.

Keys ``name``, ``address``, ``model`` (any GPU of the node; the ``NVIDIA`` prefix optional),
``preset`` and ``allocation`` (the node's allocation mode: ``device-plugin``, ``dra``,
``dra-dynamic-mig``, ``none``, ``unknown``; an agent that reports none matches no value) are
facts the agents report; any other key is a node label (Kubernetes discovery
only). Values may use shell globs (``name=gpu-a-*``); model matches ignore case.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.coordinator.fleet.inventory import NodeView
from agent.dra.mode import AllocationMode
from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.models import model_key
from agent.kube_names import LABEL_NAME_PATTERN

__all__ = ["Selector", "parse_selector"]

_FACTS = ("name", "address", "model", "preset", "allocation")

#: a Kubernetes label key: an optional DNS-subdomain prefix and "/", then a label name
_LABEL_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{LABEL_NAME_PATTERN}")
_MODES = tuple(m.value for m in AllocationMode)
#: the facts only a node's own agent tells, and of them the one its GPUs tell
_INVENTORY = ("model", "preset", "allocation")
_MODEL = ("model",)


@dataclass(frozen=True, slots=True)
class _Term:
    key: str
    pattern: str
    negate: bool

    def values(self, view: NodeView) -> Sequence[str]:
        if self.key == "name":
            return (view.name,)
        if self.key == "address":
            return (view.address,)
        if self.key == "model":
            return tuple(model_key(m) for m in view.models)
        if self.key == "preset":
            return (view.preset,)
        if self.key == "allocation":
            return () if view.allocation is None else (view.allocation.mode.value,)
        label = view.labels.get(self.key)
        return () if label is None else (label,)

    def matches(self, view: NodeView) -> bool:
        pattern = model_key(self.pattern) if self.key == "model" else self.pattern
        found = any(fnmatch.fnmatchcase(v, pattern) for v in self.values(view))
        return found != self.negate


#: a selector's size: each glob is compiled, and `GET /fleet/status` takes one from anyone
MAX_CHARS = 1024
MAX_TERMS = 32


@dataclass(frozen=True, slots=True)
class Selector:
    terms: tuple[_Term, ...] = ()
    text: str = ""

    def matches(self, view: NodeView) -> bool:
        """Every term holds; the empty selector selects every node."""
        return all(t.matches(view) for t in self.terms)

    def may_match(self, view: NodeView) -> bool:
        """Every term holds, or cannot be told for this node: its model, preset and allocation
        while it does not answer, its model while its GPUs were not read (driver not ready).
        Such a node stays in view, so it is not forgotten; a term that can be told still
        decides (``name=a,model=H100`` never picks node b)."""
        unknown = _INVENTORY if not view.reachable else _MODEL if view.gpus_unread else ()
        return all(t.key in unknown or t.matches(view) for t in self.terms)

    @property
    def needs_inventory(self) -> bool:
        """Whether only a reachable node's answer can tell (model, preset)."""
        return any(t.key in _INVENTORY for t in self.terms)

    @property
    def needs_labels(self) -> bool:
        """Whether a Kubernetes node label decides (unknown while the API is down)."""
        return any(t.key not in _FACTS for t in self.terms)

    def __str__(self) -> str:
        return self.text or "(every node)"


def parse_selector(text: str | None) -> Selector:
    if not text or not text.strip():
        return Selector()
    if len(text) > MAX_CHARS or text.count(",") >= MAX_TERMS:
        raise InvalidSpec(
            f"selector is {len(text)} characters with {text.count(',') + 1} terms",
            [FieldViolation("selector", f"at most {MAX_TERMS} terms in {MAX_CHARS} characters")],
        )
    terms = []
    for raw in text.split(","):
        part = raw.strip()
        negate = "!=" in part
        key, sep, value = part.partition("!=" if negate else "=")
        key, value = key.strip(), value.strip().removeprefix("=")  # accept ==
        if not sep or not key or not value:
            raise InvalidSpec(
                f"selector term {part!r} is not key=value or key!=value",
                [
                    FieldViolation(
                        "selector",
                        f"comma-separated key=value / key!=value; keys: {', '.join(_FACTS)} "
                        "or a node label; values may use * and ?",
                    )
                ],
            )
        _check_term(key, value)
        terms.append(_Term(key, value, negate))
    return Selector(tuple(terms), text.strip())


def _check_term(key: str, value: str) -> None:
    """A term that can match no node is a typo: refused, not an empty (or, with !=, whole)
    selection."""
    if key == "allocation" and not any(fnmatch.fnmatchcase(m, value) for m in _MODES):
        raise InvalidSpec(
            f"selector allocation={value!r} matches no allocation mode",
            [FieldViolation("selector.allocation", ", ".join(_MODES) + " (globs allowed)")],
        )
    if key not in _FACTS and not _LABEL_KEY.fullmatch(key):
        raise InvalidSpec(
            f"selector key {key!r} is not a node label key",
            [
                FieldViolation(
                    "selector",
                    f"{', '.join(_FACTS)}, or a label key: [prefix/]name, the name up to 63 "
                    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                )
            ],
        )
