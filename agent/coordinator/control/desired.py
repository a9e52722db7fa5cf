"""The desired state `coordinator serve` keeps the fleet at: a YAML file (a mounted ConfigMap).

::

    version: v1
    rollout: {max_unavailable: 10%, max_failures: 1, node_timeout_s: 900}
    mig:                                  # first matching rule wins per node
      - selector: model=H100 80GB HBM3    # the board whose profile 1g.10gb is
        config_name: all-1g.10gb
        config: |                         # a mig-parted v1 file
          version: v1
          mig-configs: {all-1g.10gb: [{devices: all, mig-enabled: true,
                                       mig-devices: {1g.10gb: 7}}]}
    power:                                # power caps (docs/power.md); first match wins
      - selector: model=*H100*
        limits:                           # the entries of a power spec
          - {gpus: all, limit: 0.8}
    sharing:
      - selector: pool=inference
        strategy: time-slicing            # or mps
        replicas: 4
        resources: [nvidia.com/gpu]
    prewarm:
      - selector: ""
        concurrency: 10                   # nodes fetching at once
        files: [{url: https://..., sha256: ..., name: llama-8b}]
        images: [{ref: registry.example/app:1.2, name: app}]
        models:                           # a repo snapshot, warmed and labelled as one item
          - {repo: meta-llama/Llama-3.1-8B-Instruct, revision: main, name: llama-8b,
             include: ["*.json", "*.safetensors", "tokenizer*"]}

Every prewarm target needs a ``name``: nodes list it, and label themselves
``gpu-agent.io/cache.<name>=ready``, under it. A model takes the fields of ModelTarget
(``repo``, ``revision``, ``endpoint``, ``include``, ``name``, ``pin``, ``header_files``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from agent import safeyaml
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.fleet.selector import Selector, parse_selector
from agent.coordinator.rollout.schedule import NODE_TIMEOUT_MAX_S, parse_max_unavailable
from agent.coordinator.rollout.specs import STRATEGIES, sharing_spec
from agent.coordinator.rollout.targets import target_violations
from agent.errors import FieldViolation, InvalidSpec
from agent.mig.spec import parse_spec
from agent.power.spec import parse as parse_power
from agent.prewarm import kinds
from agent.prewarm.target import TargetSchema
from agent.safeyaml import brief, capped
from agent.wire.prewarm import TARGET_MESSAGES

__all__ = [
    "Desired",
    "MigRule",
    "PowerRule",
    "PrewarmRule",
    "RolloutSettings",
    "SharingRule",
    "load_desired",
]

#: A fleet's desired state: room for many rules, each MIG config a text scalar of its own.
LIMITS = safeyaml.Limits(max_bytes=8 * 1024 * 1024, max_nodes=200_000, max_scalar=1024 * 1024)
_UINT32 = 2**32 - 1
_MAX_N = 1_000_000
_MAX_TIMEOUT_S = NODE_TIMEOUT_MAX_S
_MAX_CONCURRENCY = 1000


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    max_unavailable: str = "1"
    max_failures: int = 1
    node_timeout_s: float = 900.0


@dataclass(frozen=True, slots=True)
class MigRule:
    selector: Selector
    config_yaml: str
    config_name: str


@dataclass(frozen=True, slots=True)
class PowerRule:
    selector: Selector
    #: a whole power spec (version v1), as ApplyPower takes it
    spec_yaml: str


@dataclass(frozen=True, slots=True)
class SharingRule:
    selector: Selector
    #: SetSharingRequest as JSON, without request_id
    request: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PrewarmRule:
    selector: Selector
    targets: tuple[dict[str, Any], ...]
    names: tuple[str, ...]
    concurrency: int


@dataclass(frozen=True, slots=True)
class Desired:
    rollout: RolloutSettings = RolloutSettings()
    mig: tuple[MigRule, ...] = ()
    sharing: tuple[SharingRule, ...] = ()
    prewarm: tuple[PrewarmRule, ...] = ()
    source: str = field(default="", compare=False)
    power: tuple[PowerRule, ...] = ()

    def rule_for(self, rules: Sequence[Any], view: NodeView) -> Any:
        """The first rule whose selector picks ``view``, or None."""
        return next((r for r in rules if r.selector.matches(view)), None)


_TOP = ("version", "rollout", "mig", "sharing", "prewarm", "power")


def load_desired(path: Path) -> Desired:
    text = safeyaml.read_text(path, "desired", LIMITS.max_bytes, what="the desired state")
    return parse_desired(text, str(path))


def parse_desired(text: str, source: str = "<desired>") -> Desired:
    doc = safeyaml.load(text, source, LIMITS) or {}
    bad: list[FieldViolation] = []
    if not isinstance(doc, dict):
        raise InvalidSpec(f"{source}: expected a mapping", [FieldViolation("", "a mapping")])
    if doc.get("version") != "v1":
        bad.append(FieldViolation("version", f"must be v1, not {brief(doc.get('version'))}"))
    bad += [
        FieldViolation(str(k), f"unexpected field (allowed: {', '.join(_TOP)})")
        for k in doc
        if k not in _TOP
    ]
    rollout = _rollout(doc.get("rollout") or {}, bad)
    mig = tuple(_mig(raw, i, bad) for i, raw in enumerate(_list(doc, "mig", bad)))
    sharing = tuple(_sharing(raw, i, bad) for i, raw in enumerate(_list(doc, "sharing", bad)))
    prewarm = tuple(_prewarm(raw, i, bad) for i, raw in enumerate(_list(doc, "prewarm", bad)))
    power = tuple(_power(raw, i, bad) for i, raw in enumerate(_list(doc, "power", bad)))
    if bad:
        raise InvalidSpec.of(source, bad)
    # With no violations every rule parsed: none of them is None.
    return Desired(
        rollout,
        tuple(r for r in mig if r is not None),
        tuple(r for r in sharing if r is not None),
        tuple(r for r in prewarm if r is not None),
        source,
        tuple(r for r in power if r is not None),
    )


def _list(doc: Mapping[str, Any], key: str, bad: list[FieldViolation]) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        bad.append(FieldViolation(key, "must be a list of rules"))
        return []
    return value


def _keys(raw: Any, where: str, allowed: Sequence[str], bad: list[FieldViolation]) -> bool:
    if not isinstance(raw, dict):
        bad.append(FieldViolation(where, f"must be a mapping with keys: {', '.join(allowed)}"))
        return False
    extra = [k for k in raw if k not in allowed]
    bad += [
        FieldViolation(f"{where}.{k}", f"unexpected (allowed: {', '.join(allowed)})") for k in extra
    ]
    return not extra


def _selector(raw: Mapping[str, Any], where: str, bad: list[FieldViolation]) -> Selector | None:
    try:
        return parse_selector(str(raw.get("selector") or ""))
    except InvalidSpec as exc:
        bad.append(FieldViolation(f"{where}.selector", str(exc)))
        return None


def _rollout(raw: Any, bad: list[FieldViolation]) -> RolloutSettings:
    allowed = ("max_unavailable", "max_failures", "node_timeout_s")
    if not _keys(raw, "rollout", allowed, bad):
        return RolloutSettings()
    settings = RolloutSettings(
        str(raw.get("max_unavailable", "1")),
        raw.get("max_failures", 1),
        raw.get("node_timeout_s", 900.0),
    )
    try:
        parse_max_unavailable(settings.max_unavailable, 100)
    except InvalidSpec as exc:
        bad.append(FieldViolation("rollout.max_unavailable", str(exc)))
    failures = settings.max_failures
    if isinstance(failures, bool) or not isinstance(failures, int) or not 0 <= failures <= _MAX_N:
        bad.append(FieldViolation("rollout.max_failures", f"an integer 0-{_MAX_N} (0: never halt)"))
    timeout = settings.node_timeout_s
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= _MAX_TIMEOUT_S
    ):
        bad.append(
            FieldViolation("rollout.node_timeout_s", f"seconds, > 0 and <= {_MAX_TIMEOUT_S}")
        )
    return settings


def _mig(raw: Any, i: int, bad: list[FieldViolation]) -> MigRule | None:
    where = f"mig[{i}]"
    if not _keys(raw, where, ("selector", "config", "config_name"), bad):
        return None
    selector = _selector(raw, where, bad)
    text = raw.get("config")
    if not isinstance(text, str):
        bad.append(FieldViolation(f"{where}.config", "a mig-parted v1 config file, as text"))
        return None
    try:
        spec = parse_spec(text, f"{where}.config")
        name, _ = spec.select(raw.get("config_name") or None, flag=f"{where}.config_name")
    except InvalidSpec as exc:
        bad.append(FieldViolation(f"{where}.config", str(exc)))
        return None
    return None if selector is None else MigRule(selector, text, name)


def _power(raw: Any, i: int, bad: list[FieldViolation]) -> PowerRule | None:
    """A power spec per rule; what needs the node's GPUs (ranges, indices) the agent checks."""
    where = f"power[{i}]"
    if not _keys(raw, where, ("selector", "limits"), bad):
        return None
    selector = _selector(raw, where, bad)
    text = yaml.safe_dump({"version": "v1", "power": raw.get("limits")}, sort_keys=False)
    try:
        parse_power(text)
    except InvalidSpec as exc:
        bad += [
            FieldViolation(f"{where}.limits{v.field.removeprefix('power')}", v.description)
            for v in exc.violations
        ]
        return None
    return PowerRule(selector, text) if selector is not None else None


def _sharing(raw: Any, i: int, bad: list[FieldViolation]) -> SharingRule | None:
    where = f"sharing[{i}]"
    allowed = ("selector", "strategy", "replicas", "resources", "rename")
    if not _keys(raw, where, allowed, bad):
        return None
    selector = _selector(raw, where, bad)
    strategy = raw.get("strategy")
    replicas = raw.get("replicas")
    resources = raw.get("resources") or ["nvidia.com/gpu"]
    if strategy not in STRATEGIES:
        bad.append(FieldViolation(f"{where}.strategy", " or ".join(STRATEGIES)))
        strategy = None
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 2 <= replicas <= _UINT32:
        bad.append(FieldViolation(f"{where}.replicas", f"an integer 2-{_UINT32}"))
        replicas = None
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        bad.append(FieldViolation(f"{where}.resources", "a list of resource names"))
        resources = None
    if selector is None or strategy is None or not isinstance(replicas, int) or resources is None:
        return None
    try:
        # The request a rollout record keeps, built and checked as `fleet apply --sharing` does.
        spec = sharing_spec(None, strategy, resources, replicas, bool(raw.get("rename", False)))
    except InvalidSpec as exc:
        bad += [FieldViolation(where, str(v)) for v in exc.violations]
        return None
    return SharingRule(selector, spec["request"])


def _prewarm_kinds() -> list[tuple[str, str, Any, TargetSchema]]:
    """(list key, PrewarmTarget field, its message, its schema) of each registered kind with
    an API target (agent/prewarm/target.py): ``files``, ``images``, ``models``."""
    messages = TARGET_MESSAGES
    return [(s.plural, s.kind, messages[s.kind], s) for s in kinds.schemas() if s.kind in messages]


def _listed(known: Sequence[tuple[str, str, Any, TargetSchema]], last: str) -> str:
    """``files, images and models``: the list keys, as a sentence."""
    plurals = [plural for plural, _, _, _ in known]
    return f"{', '.join(plurals[:-1])} {last} {plurals[-1]}"


#: Targets of one rule: what one SubmitPrewarm takes (a whole model repo is one target).
_MAX_TARGETS = 1000


def _prewarm(raw: Any, i: int, bad: list[FieldViolation]) -> PrewarmRule | None:
    where = f"prewarm[{i}]"
    known = _prewarm_kinds()
    allowed = ("selector", "concurrency", *(plural for plural, _, _, _ in known))
    if not _keys(raw, where, allowed, bad):
        return None
    selector = _selector(raw, where, bad)
    concurrency = raw.get("concurrency", 10)
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= _MAX_CONCURRENCY
    ):
        bad.append(FieldViolation(f"{where}.concurrency", f"an integer 1-{_MAX_CONCURRENCY}"))
    targets: list[dict[str, Any]] = []
    names: list[str] = []
    seen: set[str] = set()
    errors_before = len(bad)
    for kind, key, message, schema in known:
        listed = raw.get(kind) or []
        if not isinstance(listed, list):
            bad.append(FieldViolation(f"{where}.{kind}", "a list"))
            continue
        if len(listed) > _MAX_TARGETS:
            bad.append(FieldViolation(f"{where}.{kind}", f"at most {_MAX_TARGETS} entries"))
            continue
        for j, item in enumerate(listed):
            field_path = f"{where}.{kind}[{j}]"
            if not isinstance(item, dict):
                bad.append(FieldViolation(field_path, f"a mapping (a {key} target)"))
                continue
            try:
                parsed = json_format.ParseDict(item, message())
            except (json_format.ParseError, TypeError, ValueError) as exc:
                bad.append(FieldViolation(field_path, capped(str(exc))))
                continue
            # The checks the agent makes of a target, once here instead of from every node.
            found = target_violations(schema, parsed, field_path)
            if found:
                bad += found
                continue
            if not parsed.name:
                bad.append(FieldViolation(f"{field_path}.name", "required: how nodes list it"))
                continue
            if parsed.name in seen:
                bad.append(FieldViolation(f"{field_path}.name", "a name no other target has"))
                continue
            targets.append({key: json_format.MessageToDict(parsed)})
            names.append(parsed.name)
            seen.add(parsed.name)
    if len(targets) > _MAX_TARGETS:
        bad.append(FieldViolation(where, f"at most {_MAX_TARGETS} {_listed(known, 'and')}"))
    if not targets and len(bad) == errors_before:
        bad.append(FieldViolation(where, f"at least one of {_listed(known, 'or')}"))
    if selector is None or not targets or not isinstance(concurrency, int):
        return None
    return PrewarmRule(selector, tuple(targets), tuple(names), concurrency)
