"""The generic loader: defaults < YAML file < env ``GPU_AGENT_*`` < flags, validated up front.

It walks the schema's fields (agent/config/schema.py) and their rules, so it knows no setting by
name: one path parses, coerces and validates every source.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from agent import safeyaml
from agent.config.rules import RULES_KEY as _RULES
from agent.config.rules import Rules as _Rules
from agent.config.schema import RETIRED, AgentConfig
from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import brief

ENV_PREFIX = "GPU_AGENT_"
CONFIG_ENV = "GPU_AGENT_CONFIG"
_ENV_SEP = "__"

log = logging.getLogger(__name__)

# --- value kinds: how raw text or YAML values become typed values -------------------------------


def _parse_str(raw: object, rules: _Rules) -> str:
    if isinstance(raw, str) and raw:
        return raw
    raise ValueError(raw)


def _parse_path(raw: object, rules: _Rules) -> Path:
    if isinstance(raw, Path):
        return raw
    if isinstance(raw, str) and raw:
        return Path(raw)
    raise ValueError(raw)


def _parse_float(raw: object, rules: _Rules) -> float:
    # bool is an int subclass; `true` for a number is a mistake, not 1.0.
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(raw)
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


_BYTE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGTP])(i?))?B?", re.IGNORECASE | re.ASCII)
_BYTE_SIZE_TEXT = (
    "a byte count: an integer, optionally suffixed K, M, G, T (powers of 1000) "
    "or Ki, Mi, Gi, Ti (powers of 1024), e.g. 200Gi"
)


def _parse_byte_size(text: str) -> int:
    match = _BYTE_SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    number, prefix, binary = match.groups()
    power = "KMGTP".index(prefix.upper()) + 1 if prefix else 0
    value = Decimal(number) * (1024 if binary else 1000) ** power
    if value != value.to_integral_value():
        raise ValueError(text)
    return int(value)


def _parse_int(raw: object, rules: _Rules) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        return _parse_byte_size(raw) if rules.byte_size else int(raw.strip(), 10)
    raise ValueError(raw)


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _parse_bool(raw: object, rules: _Rules) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(raw)


def _parse_strings(raw: object, rules: _Rules) -> tuple[str, ...]:
    if isinstance(raw, str):  # env and flags: comma-separated
        items: Sequence[object] = [item.strip() for item in raw.split(",") if item.strip()]
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        raise ValueError(raw)
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError(raw)
    return tuple(typing.cast(Sequence[str], items))


@dataclass(frozen=True)
class _Kind:
    name: str  # in config_schema
    expected: str  # in errors and docs
    parse: Callable[[object, _Rules], object]  # raises ValueError on a bad value


_KINDS: dict[object, _Kind] = {
    str: _Kind("string", "a non-empty string", _parse_str),
    Path: _Kind("path", "a path", _parse_path),
    float: _Kind("number", "a finite number", _parse_float),
    int: _Kind("integer", "an integer", _parse_int),
    bool: _Kind("bool", "true or false (in env and flags also 1/0, yes/no, on/off)", _parse_bool),
    tuple: _Kind(
        "list", "a list of non-empty strings (comma-separated in env and flags)", _parse_strings
    ),
}


# --- the schema, walked once from the dataclasses ------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]
    kind: _Kind
    optional: bool
    rules: _Rules
    default: object

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + _ENV_SEP.join(self.path).upper()


_Tree = dict[str, "_Leaf | _Tree"]


def _walk(cls: type, prefix: tuple[str, ...]) -> Iterator[_Leaf]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, path = hints[f.name], (*prefix, f.name)
        if dataclasses.is_dataclass(hint):
            yield from _walk(typing.cast(type, hint), path)
            continue
        args = typing.get_args(hint)
        optional = type(None) in args
        base = next(arg for arg in args if arg is not type(None)) if optional else hint
        rules: _Rules = f.metadata[_RULES]
        default = rules.default_doc if f.default is dataclasses.MISSING else f.default
        kind = _KINDS[typing.get_origin(base) or base]
        yield _Leaf(path, kind, optional, rules, default)


@cache
def _leaves() -> tuple[_Leaf, ...]:
    return tuple(_walk(AgentConfig, ()))


@cache
def _tree() -> _Tree:
    root: _Tree = {}
    for leaf in _leaves():
        node = root
        for part in leaf.path[:-1]:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[leaf.path[-1]] = leaf
    return root


@cache
def _by_env() -> dict[str, _Leaf]:
    return {leaf.env: leaf for leaf in _leaves()}


@cache
def _by_key() -> dict[str, _Leaf]:
    return {leaf.key: leaf for leaf in _leaves()}


def _expected(leaf: _Leaf) -> str:
    """What the setting accepts, in words: every error and the docs say it the same way."""
    rules = leaf.rules
    if rules.choices:
        text = "one of: " + ", ".join(rules.choices)
    elif rules.allowed:
        text = rules.allowed
    elif rules.byte_size:
        text = _BYTE_SIZE_TEXT
    else:
        text = leaf.kind.expected
    limits = ((">=", rules.ge), (">", rules.gt), ("<=", rules.le))
    bounds = [f"{op} {limit:g}" for op, limit in limits if limit is not None]
    if bounds:
        text += ", " + " and ".join(bounds)
    if leaf.kind is _KINDS[tuple] and "comma-separated" not in text:
        text += " (comma-separated in env and flags)"
    if leaf.optional:
        text += (
            "; or empty (null in YAML) for none"
            if rules.empty_unsets
            else "; or unset (null in YAML) for none"
        )
    return text


def _within(rules: _Rules, value: Any) -> bool:
    return (
        (not rules.choices or value in rules.choices)
        and (rules.ge is None or value >= rules.ge)
        and (rules.gt is None or value > rules.gt)
        and (rules.le is None or value <= rules.le)
        and (rules.check is None or rules.check(value))
    )


def _coerce(leaf: _Leaf, raw: object) -> object:
    """The typed, checked value of ``raw``; raises ValueError. Empty text unsets optionals
    (unless their rules say otherwise: then it is refused)."""
    empty = isinstance(raw, str) and not raw.strip()
    if raw is None or (leaf.optional and leaf.rules.empty_unsets and empty):
        if leaf.optional:
            return None
        raise ValueError(raw)
    value = leaf.kind.parse(raw, leaf.rules)
    if not _within(leaf.rules, value):
        raise ValueError(raw)
    return value


def _render(path: Sequence[str], *, env: bool, section: bool = False) -> str:
    if env:
        return ENV_PREFIX + _ENV_SEP.join(path).upper() + (_ENV_SEP + "*" if section else "")
    return ".".join(path)


def _unknown(prefix: Sequence[str], node: _Tree, key: str, *, env: bool) -> str:
    """Says the key is unknown and lists the valid keys of its section."""
    if env:  # env names only make sense in full
        names = [
            _render((*prefix, n), env=True, section=isinstance(c, dict)) for n, c in node.items()
        ]
    else:
        names = list(node)
    close = difflib.get_close_matches(key, list(node), n=1)
    hint = f" (did you mean {_render((*prefix, close[0]), env=env)}?)" if close else ""
    where = f" in {'.'.join(prefix)}" if prefix and not env else ""
    return f"unknown key{hint}; valid keys{where}: {', '.join(names)}"


def _retired(key: str, label: str) -> bool:
    """Whether ``key`` is retired, and then a warning names it where it was given (``label``)."""
    why = RETIRED.get(key)
    if why is not None:
        log.warning("config %s is no longer read and is ignored (%s); remove it", label, why)
    return why is not None


def _lookup(parts: Sequence[str], *, env: bool) -> _Leaf | str:
    """The setting at ``parts``, or why there is none."""
    node = _tree()
    for depth, part in enumerate(parts):
        child = node.get(part)
        if child is None:
            return _unknown(parts[:depth], node, part, env=env)
        if isinstance(child, _Leaf):
            if depth == len(parts) - 1:
                return child
            return f"{_render(parts[: depth + 1], env=env)} is a setting, not a section"
        node = child
    keys = ", ".join(_render((*parts, name), env=env) for name in node)
    return f"is a section, not a setting; set one of: {keys}"


# --- sources --------------------------------------------------------------------------------------


@dataclass
class _Collector:
    """Typed values by key path, later sources overwriting earlier ones, and every violation."""

    values: dict[tuple[str, ...], object] = field(default_factory=dict)
    violations: list[FieldViolation] = field(default_factory=list)

    def set(self, leaf: _Leaf, label: str, raw: object) -> None:
        try:
            self.values[leaf.path] = _coerce(leaf, raw)
        except ValueError:
            self.reject(label, f"expected {_expected(leaf)}; got {brief(raw)}")

    def reject(self, label: str, description: str) -> None:
        self.violations.append(FieldViolation(label, description))


def _read_yaml(file: Path) -> Mapping[object, object]:
    text = safeyaml.read_text(file, "config", what="config file")
    try:
        data = safeyaml.load(text, "config")  # errors then name the line and column
    except InvalidSpec as exc:
        raise InvalidSpec(f"config file {file}: {exc}", exc.violations) from None
    if data is None:  # an empty file: all defaults
        return {}
    if not isinstance(data, Mapping):
        description = f"expected a mapping of settings; got {type(data).__name__}"
        raise InvalidSpec(
            f"config file {file}: {description}", [FieldViolation("config", description)]
        )
    return data


def _apply_mapping(
    data: Mapping[object, object], node: _Tree, prefix: tuple[str, ...], out: _Collector
) -> None:
    for key, raw in data.items():
        label = ".".join((*prefix, str(key)))
        child = node.get(key) if isinstance(key, str) else None
        if child is None and _retired(label, label):
            continue
        if child is None:
            out.reject(label, _unknown(prefix, node, str(key), env=False))
        elif isinstance(child, _Leaf):
            out.set(child, label, raw)
        elif isinstance(raw, Mapping):
            _apply_mapping(raw, child, (*prefix, str(key)), out)
        elif raw is not None:  # `telemetry:` with nothing under it is an empty section
            out.reject(label, f"expected a mapping with keys: {', '.join(child)}; got {brief(raw)}")


def _apply_env(env: Mapping[str, str], out: _Collector) -> None:
    for leaf in _leaves():  # aliases first, so the GPU_AGENT_ name wins
        alias = next((name for name in leaf.rules.env_aliases if name in env), None)
        if alias is not None and leaf.env not in env:
            out.set(leaf, f"env {alias}", env[alias])
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        label = f"env {name}"
        known = _by_env().get(name)
        if known is not None:
            out.set(known, label, env[name])
            continue
        parts = name.removeprefix(ENV_PREFIX).lower().split(_ENV_SEP)
        if _retired(".".join(parts), label):
            continue
        found = _lookup(parts, env=True)
        out.reject(
            label, f"unknown key; did you mean {found.env}?" if isinstance(found, _Leaf) else found
        )


def _apply_flags(flags: Mapping[str, object], out: _Collector) -> None:
    for key, raw in flags.items():
        if raw is None:  # the flag was not given
            continue
        found = _by_key().get(key) or _lookup(key.split("."), env=False)
        if isinstance(found, _Leaf):
            out.set(found, f"flag {key}", raw)
        else:
            out.reject(f"flag {key}", found)


def _build(cls: type, prefix: tuple[str, ...], values: Mapping[tuple[str, ...], object]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], path, values)
        elif path in values:
            kwargs[f.name] = values[path]
    return cls(**kwargs)


def _value(config: AgentConfig, path: Sequence[str]) -> object:
    value: object = config
    for part in path:
        value = getattr(value, part)
    return value


def _missing_requirements(config: AgentConfig) -> Iterator[FieldViolation]:
    for leaf in _leaves():
        other = leaf.rules.requires
        if other is None or _value(config, leaf.path) is None:
            continue
        sibling = (*leaf.path[:-1], other)
        if _value(config, sibling) is None:
            yield FieldViolation(leaf.key, f"is set, so {'.'.join(sibling)} must be set too")


def _raise(violations: Sequence[FieldViolation], file: Path | None) -> typing.NoReturn:
    source = f" (config file {file})" if file is not None else ""
    lines = "".join(f"\n  {v}" for v in violations)
    raise InvalidSpec(f"invalid agent configuration{source}:{lines}", violations)


def load_config(
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> AgentConfig:
    """Build the config from defaults < ``file`` < ``env`` < ``flags`` and validate all of it.

    ``env`` defaults to ``os.environ``; only its ``GPU_AGENT_*`` keys (and the documented
    aliases) are read, and an unknown ``GPU_AGENT_*`` key is an error. Without ``file``,
    ``GPU_AGENT_CONFIG`` names the config file. ``flags`` holds dotted keys; None values are
    flags not given. Every bad value in every source is reported at once in one `InvalidSpec`.
    """
    env = os.environ if env is None else env
    if file is None and env.get(CONFIG_ENV):
        file = Path(env[CONFIG_ENV])
    out = _Collector()
    if file is not None:
        _apply_mapping(_read_yaml(file), _tree(), (), out)
    _apply_env(env, out)
    _apply_flags(flags or {}, out)
    if out.violations:
        _raise(out.violations, file)
    config: AgentConfig = _build(AgentConfig, (), out.values)
    problems = list(_missing_requirements(config))
    if problems:
        _raise(problems, file)
    return config


def _plain(value: object) -> object:
    """JSON/YAML-friendly form of a default."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def config_schema() -> list[dict[str, object]]:
    """One row per setting, in declaration order: for generated docs and manifest checks.

    Keys: ``key`` (dotted path), ``env``, ``env_aliases``, ``type`` (string, path, number,
    integer, bool, list), ``optional``, ``default``, ``allowed`` (in words) and ``doc``.
    """
    return [
        {
            "key": leaf.key,
            "env": leaf.env,
            "env_aliases": list(leaf.rules.env_aliases),
            "type": leaf.kind.name,
            "optional": leaf.optional,
            "default": _plain(leaf.default),
            "allowed": _expected(leaf),
            "doc": leaf.rules.doc,
        }
        for leaf in _leaves()
    ]
