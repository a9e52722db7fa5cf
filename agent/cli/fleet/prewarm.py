"""``gpu-agent fleet prewarm``: fan prewarm targets out over nodes."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from agent.cli import kind_options
from agent.cli.coordinator import fleet_options, options_from
from agent.cli.fleet.rollout import rollout_args, rollout_options, start_rollout
from agent.cli.render import output_option
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.fields import SHARED_FLEET_HELP
from agent.prewarm.target import Field


def _fields() -> list[Field]:
    """Each kind's source (named as a manifest names it: ``--model`` is a repo) and the fields
    it alone has, then the fields kinds share, with their one help (`SHARED_FLEET_HELP`)."""
    schemas = kinds.schemas()
    seen = [f.name for s in schemas for f in s.by_name.values() if f.name != s.source]
    own: list[Field] = []
    shared: dict[str, Field] = {}
    for schema in schemas:
        own.append(dataclasses.replace(schema.by_name[schema.source], name=schema.manifest_source))
        for f in schema.by_name.values():
            if f.name != schema.source and seen.count(f.name) == 1:
                own.append(f)
            elif f.name != schema.source and f.name not in shared:
                fleet = SHARED_FLEET_HELP.get(f.name, f.arg.fleet)
                shared[f.name] = dataclasses.replace(f, arg=dataclasses.replace(f.arg, fleet=fleet))
    return [*own, *shared.values()]


_FIELDS = _fields()
_BY_NAME = {f.name: f for f in _FIELDS}


@click.command("prewarm")
@fleet_options
@rollout_options
@kind_options.options(_FIELDS, fleet=True)
@output_option
def prewarm(selector: str | None, output: str, **kwargs: Any) -> None:
    """Warm one cache item on many nodes, at most --max-unavailable nodes fetching at once;
    one source option (each kind has one, listed below) says what to warm.

    --max-unavailable is the concurrency here: it keeps the origin from being stampeded. Each
    node's readiness is reported as it comes, until every node is warm or failed. A model
    (--model) is a repo snapshot warmed and labelled as one item on each node.

    \b
    Examples:
      gpu-agent fleet prewarm --url https://models.example/llama.safetensors \\
        --sha256 9f86d0... --name llama-8b --max-unavailable 20 --max-failures 0 --kubernetes
      gpu-agent fleet prewarm --model meta-llama/Llama-3.1-8B-Instruct --name llama-8b \\
        --include '*.json' --include '*.safetensors' --header-file Authorization=/secrets/hf \\
        --max-unavailable 10 --max-failures 0 --kubernetes
    """
    given = {f.name: kwargs.pop(f.name) for f in _FIELDS}
    rollout = rollout_args(kwargs)
    spec = _prewarm_spec(given)
    start_rollout(options_from(kwargs), "prewarm", spec, selector, rollout, output)


def _refuse(spec: str) -> Exception:
    return InvalidSpec(
        f"--header-file {spec!r}: expected HEADER=PATH",
        [FieldViolation("header_files", "HEADER=PATH")],
    )


def _prewarm_spec(given: dict[str, Any]) -> dict[str, Any]:
    """The rollout spec of the one target the options ask for; a bad combination is refused
    here, naming the option, before any node is contacted."""
    from agent.coordinator.rollout.specs import prewarm_spec

    sources = {s.manifest_source: s for s in kinds.schemas()}
    named = [f"--{o}" for o in sources]
    chosen = [o for o in sources if given[o] is not None]
    if len(chosen) != 1:
        listed = f"{', '.join(named[:-1])} or {named[-1]}"
        raise InvalidSpec(
            f"give exactly one of {', '.join(named)}",
            [FieldViolation(chosen[1] if len(chosen) > 1 else next(iter(sources)), listed)],
        )
    option = chosen[0]
    schema = sources[option]
    for name, value in given.items():
        if value and name not in sources and name not in schema.fields:
            owners = [f"--{o}" for o, s in sources.items() if name in s.fields]
            flag = kind_options.option_name(_BY_NAME[name], fleet=True)
            raise InvalidSpec(
                f"{flag} is for {' and '.join(owners)}, not --{option}",
                [FieldViolation(name, f"only with {' or '.join(owners)}")],
            )
    values = kind_options.values(schema, {**given, schema.source: given[option]}, _refuse)
    try:
        return prewarm_spec(schema, values)
    except InvalidSpec as exc:
        # Fields named as the options are: --model is the repo.
        bad = [
            FieldViolation(option if v.field == schema.source else v.field, v.description)
            for v in exc.violations
        ]
        raise InvalidSpec(f"--{option}: {bad[0]}", bad) from None
