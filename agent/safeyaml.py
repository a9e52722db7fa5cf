"""YAML (and JSON) from untrusted hands, parsed within fixed bounds. Pure.

Every input the agent reads as YAML (RPC fields, its config file, prewarm manifests, the device
plugin's config, the coordinator's desired/demand/plan files) goes through `load`. PyYAML's safe
loader alone is not enough: a 400-byte document of nested aliases (a "billion laughs") expands to
gigabytes as soon as anything walks it, deep nesting ends in a RecursionError, a list as a mapping
key is a TypeError, and ``int()`` of a 5000-digit scalar raises ValueError. Here each of those is
refused while composing, before any Python object is built, with `InvalidSpec` naming the field
and the path in the document, and a message of bounded length that never echoes the input.

The pure-Python composer is used on purpose: libyaml's composes in C, with no hook to count.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from agent.errors import FieldViolation, InvalidSpec

__all__ = [
    "DEFAULT",
    "MAX_MESSAGE",
    "Limits",
    "brief",
    "capped",
    "load",
    "read_bytes",
    "read_text",
    "some",
]

_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"
#: Longest text of one refusal; a violation never carries more of the input than this.
MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one document. The defaults fit every file the agent reads by a wide margin."""

    #: Size of the text in bytes (UTF-8).
    max_bytes: int = 1024 * 1024
    #: Nesting of mappings and sequences (the document itself is depth 1).
    max_depth: int = 32
    #: Nodes of the document as expanded: an alias counts the whole subtree it names.
    max_nodes: int = 20_000
    #: Aliases (``*name``); anchors are harmless, references to them are what expands.
    max_aliases: int = 16
    #: Characters of one scalar.
    max_scalar: int = 16 * 1024
    #: Characters of an integer scalar (uint64 in binary with ``0b`` is 66).
    max_int_chars: int = 66
    #: Integers beyond +-2**64 fit no field the agent has.
    max_int: int = 2**64


DEFAULT = Limits()


#: A certificate, key or CA file larger than this is refused unread: a system CA bundle is
#: ~220 KiB.
MAX_PEM_BYTES = 1 << 20


def ascii_int(text: str, digits: int = 9) -> int | None:
    """``text`` as a whole number when it is 1 to ``digits`` ASCII digits, else None:
    ``"²".isdigit()`` is True and int() refuses it, int() reads "٣" as 3, and thousands of
    digits cost time. What a protocol or a flag means by a number."""
    if not 0 < len(text) <= digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, as a person reads it: ``line 4, column 1: expected the node content,
    but found '<stream end>' (while parsing a flow node)``; PyYAML's own text adds its
    ``"<unicode string>"`` and a caret snippet."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return capped(" ".join(str(exc).split()))
    context = getattr(exc, "context", None)
    said = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return capped(" ".join((f"{said} ({context})" if context else said).split()))


def capped(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, saying it was cut."""
    return text if len(text) <= limit else text[: limit - 12] + " …(cut)"


def some(names: Sequence[str], shown: int, sep: str = ", ") -> str:
    """The first ``shown`` of ``names`` and how many more: ``a, b and 3 more``."""
    more = len(names) - shown
    return sep.join(names[:shown]) + (f" and {more} more" if more > 0 else "")


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 4
_REPR.maxlevel = 2


def brief(value: object) -> str:
    """A short repr of a parsed value for an error message: bounded however big it is."""
    return capped(_REPR.repr(value), 80)


class _Refused(Exception):
    def __init__(self, path: str, description: str) -> None:
        super().__init__(description)
        self.path = path
        self.description = description


class _BoundedComposer(Composer):
    """Composer that counts as it goes and refuses at the first bound passed."""

    limits: Limits
    check_event: Callable[..., bool]  # the Parser's, beside this class in the loader

    def _bounded_init(self, limits: Limits) -> None:
        self.limits = limits
        self._path: list[str] = []
        self._aliases = 0
        self._nodes = 0
        # Expanded size of each composed collection, so an alias to it costs what it expands to.
        self._weights: dict[int, int] = {}

    def _where(self) -> str:
        return "".join(self._path).lstrip(".")

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        lim = self.limits
        if isinstance(parent, MappingNode) and index is None and not self.check_event(ScalarEvent):
            raise _Refused(self._where(), "mapping keys must be plain scalars (strings, numbers)")
        if isinstance(parent, SequenceNode):
            self._path.append(f"[{index}]")
        elif isinstance(parent, MappingNode) and isinstance(index, ScalarNode):
            self._path.append("." + capped(index.value, 40))
        else:
            self._path.append("")
        try:
            alias = self.check_event(AliasEvent)
            if alias:
                self._aliases += 1
                if self._aliases > lim.max_aliases:
                    raise _Refused(self._where(), f"at most {lim.max_aliases} YAML aliases (*name)")
            elif self.check_event(MappingStartEvent, SequenceStartEvent) and (
                len(self._path) > lim.max_depth
            ):
                raise _Refused(self._where(), f"nested deeper than {lim.max_depth} levels")
            before = self._nodes
            node = super().compose_node(parent, index)
            if node is not None:
                self._account(node, before, alias)
            return node
        finally:
            self._path.pop()

    def _account(self, node: Node, before: int, alias: bool) -> None:
        lim = self.limits
        if alias and not isinstance(node, ScalarNode):
            known = self._weights.get(id(node))
            if known is None:  # still open: `&a [*a]` would build a list that holds itself
                raise _Refused(self._where(), "an alias inside the node it names (a cycle)")
            self._nodes += known  # it costs the subtree it names, again
        elif isinstance(node, ScalarNode):
            self._nodes += 1
            self._scalar(node)
        else:
            self._nodes += 1
            self._weights[id(node)] = self._nodes - before
        if self._nodes > lim.max_nodes:
            raise _Refused(self._where(), f"more than {lim.max_nodes} values once aliases expand")

    def _scalar(self, node: ScalarNode) -> None:
        lim = self.limits
        value = node.value
        if len(value) > lim.max_scalar:
            raise _Refused(self._where(), f"a value longer than {lim.max_scalar} characters")
        if node.tag != _INT_TAG:
            return
        if len(value) > lim.max_int_chars:
            raise _Refused(self._where(), f"an integer longer than {lim.max_int_chars} characters")
        number = SafeConstructor.construct_yaml_int(self, node)  # type: ignore[arg-type]
        if abs(number) > lim.max_int:
            raise _Refused(self._where(), "an integer beyond +-2**64")


class _Constructor(SafeConstructor):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Duplicate keys are refused: PyYAML would keep the last one without a word. Keys that
        # a merge (``<<: *base``) brings in may be overridden, as YAML intends.
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise _Refused("", f"duplicate key {brief(key)} (line {line})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Loader(Reader, Scanner, Parser, _BoundedComposer, _Constructor, Resolver):
    def __init__(self, stream: str, limits: Limits) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _Constructor.__init__(self)
        Resolver.__init__(self)
        self._bounded_init(limits)


def read_text(
    path: Path, field: str, max_bytes: int = DEFAULT.max_bytes, what: str | None = None
) -> str:
    """A file's UTF-8 text, reading no more than ``max_bytes`` + 1 of it: a file too big is
    refused before it is in memory. Every refusal (missing, unreadable, too big, not UTF-8) is
    an InvalidSpec naming ``field``, and ``what`` the file is in its message (the field when
    not given)."""
    what = what or field
    data = _read(path, field, max_bytes, what)
    return decoded(data, field, max_bytes, f"{what} {path}")


def read_bytes(
    path: Path, field: str, max_bytes: int = DEFAULT.max_bytes, what: str | None = None
) -> bytes:
    """A file's bytes, as `read_text` reads them (no more than ``max_bytes`` + 1, a refusal
    an InvalidSpec naming ``field``), not decoded: a PEM, a token."""
    what = what or field
    data = _read(path, field, max_bytes, what)
    if len(data) > max_bytes:
        raise InvalidSpec(
            f"{what} {path} is larger than {max_bytes} bytes",
            [FieldViolation(field, f"at most {max_bytes} bytes")],
        )
    return data


def _read(path: Path, field: str, max_bytes: int, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InvalidSpec(
            f"{what} {path} does not exist", [FieldViolation(field, f"{path} does not exist")]
        ) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InvalidSpec(
            f"cannot read {what} {path}: {why}", [FieldViolation(field, why)]
        ) from None


def decoded(data: bytes, field: str, max_bytes: int, what: str) -> str:
    """``data`` (read up to ``max_bytes`` + 1) as UTF-8 text; InvalidSpec naming ``field`` when
    it is longer or not UTF-8, with ``what`` it is (a file, stdin) in the message."""
    if len(data) > max_bytes:
        raise InvalidSpec(
            f"{what} is larger than {max_bytes} bytes",
            [FieldViolation(field, f"at most {max_bytes} bytes")],
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(
            f"{what} is not UTF-8 text", [FieldViolation(field, f"not UTF-8 ({exc.reason})")]
        ) from None


def load(text: str | bytes, field: str, limits: Limits = DEFAULT) -> Any:
    """The one document in ``text``; InvalidSpec naming ``field`` (and the path in it) when it
    passes a bound in ``limits`` or is not YAML."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise InvalidSpec(
            f"{field}: {size} bytes, at most {limits.max_bytes}",
            [FieldViolation(field, f"at most {limits.max_bytes} bytes")],
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidSpec(
                f"{field}: not UTF-8 text", [FieldViolation(field, f"not UTF-8 ({exc.reason})")]
            ) from None
    loader: _Loader | None = None
    try:
        loader = _Loader(text, limits)  # its reader refuses control characters at once
        return loader.get_single_data()
    except _Refused as exc:
        where = f"{field}: {exc.path}" if exc.path else field
        raise InvalidSpec(
            f"{where}: refused: {exc.description}",
            [FieldViolation(where, exc.description)],
        ) from None
    except yaml.YAMLError as exc:
        description = _yaml_problem(exc)
        raise InvalidSpec(
            f"{field}: not valid YAML: {description}", [FieldViolation(field, description)]
        ) from None
    except RecursionError:  # not reachable within max_depth; kept so none escapes as a bug
        raise InvalidSpec(
            f"{field}: nested too deeply", [FieldViolation(field, "nested too deeply")]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
