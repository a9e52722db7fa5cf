"""``gpu-agent fleet prewarm``: fan prewarm targets out over nodes."""

from __future__ import annotations

from typing import Any

import click

from agent.cli.coordinator import (
    fleet_options,
    options_from,
)
from agent.cli.fleet.rollout import rollout_args, rollout_options, start_rollout
from agent.cli.render import output_option
from agent.errors import FieldViolation, InvalidSpec


@click.command("prewarm")
@fleet_options
@rollout_options
@click.option("--url", default=None, help="File to fetch (https://, or http:// where allowed).")
@click.option("--sha256", default="", help="Expected sha256 of the file.")
@click.option("--image", default=None, help="Container image to pull instead.")
@click.option("--runtime-handler", default="", help="CRI runtime handler, e.g. nydus.")
@click.option(
    "--model", default=None, metavar="REPO", help="Model repo snapshot to warm as one item."
)
@click.option("--revision", default="", help="The model's branch, tag or commit (default main).")
@click.option(
    "--endpoint",
    default="",
    help="Hub serving the model (/api/models/... and /<repo>/resolve/...); default huggingface.co.",
)
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Only the model's files matching GLOB (repeatable); all files without it.",
)
@click.option("--name", "item_name", default="", help="Item name (the node label's name).")
@click.option("--pin", is_flag=True, help="Never evict it.")
@click.option(
    "--header-file",
    "header_files",
    multiple=True,
    metavar="HEADER=PATH",
    help="A header whose value each node reads from a file (a mounted secret).",
)
@output_option
def prewarm(
    url: str | None,
    sha256: str,
    image: str | None,
    runtime_handler: str,
    model: str | None,
    revision: str,
    endpoint: str,
    include: tuple[str, ...],
    item_name: str,
    pin: bool,
    header_files: tuple[str, ...],
    selector: str | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Warm one file, image or model on many nodes, at most --max-unavailable nodes fetching
    at once.

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
    rollout = rollout_args(kwargs)
    spec = _prewarm_spec(
        {"url": url, "image": image, "model": model},
        {
            "sha256": sha256,
            "runtime_handler": runtime_handler,
            "revision": revision,
            "endpoint": endpoint,
            "include": include,
        },
        item_name,
        pin,
        header_files,
    )
    start_rollout(options_from(kwargs), "prewarm", spec, selector, rollout, output)


_MODEL_OPTION = {"model.repo": "model"}
#: The options that belong to one source only, and that source.
_SOURCE_OPTIONS = {
    "sha256": "url",
    "runtime_handler": "image",
    "revision": "model",
    "endpoint": "model",
    "include": "model",
}


def _header_files(specs: tuple[str, ...]) -> dict[str, str]:
    """``--header-file HEADER=PATH`` options as {header: path}; a malformed one is refused."""
    headers = {}
    for spec in specs:
        key, sep, path = spec.partition("=")
        if not sep or not key or not path:
            raise InvalidSpec(
                f"--header-file {spec!r}: expected HEADER=PATH",
                [FieldViolation("header_files", "HEADER=PATH")],
            )
        headers[key] = path
    return headers


def _prewarm_spec(
    sources: dict[str, str | None],
    extras: dict[str, Any],
    name: str,
    pin: bool,
    header_files: tuple[str, ...],
) -> dict[str, Any]:
    """The rollout spec of the one target the options ask for; a bad combination is refused
    here, naming the option, before any node is contacted."""
    from agent.coordinator.rollout.specs import prewarm_spec, target_violations

    given = [k for k, v in sources.items() if v is not None]
    if len(given) != 1:
        raise InvalidSpec(
            "give exactly one of --url, --image, --model",
            [FieldViolation(given[1] if len(given) > 1 else "url", "--url, --image or --model")],
        )
    (source,) = given
    stray = [k for k, v in extras.items() if v and _SOURCE_OPTIONS[k] != source]
    if stray:
        option = "--" + stray[0].replace("_", "-")
        raise InvalidSpec(
            f"{option} is for --{_SOURCE_OPTIONS[stray[0]]}, not --{source}",
            [FieldViolation(stray[0], f"only with --{_SOURCE_OPTIONS[stray[0]]}")],
        )
    headers = _header_files(header_files)
    fields: dict[str, Any]
    if source == "image":
        if headers:
            raise InvalidSpec(
                "--header-file is for --url and --model; image pulls use the node's "
                "registry credentials",
                [FieldViolation("header_files", "only with --url or --model")],
            )
        kind, fields = (
            "image",
            {
                "ref": sources["image"] or "",
                "name": name,
                "runtime_handler": extras["runtime_handler"],
                "pin": pin,
            },
        )
    elif source == "url":
        kind, fields = (
            "file",
            {
                "url": sources["url"] or "",
                "name": name,
                "sha256": extras["sha256"],
                "pin": pin,
                "header_files": headers,
            },
        )
    else:
        kind, fields = (
            "model",
            {
                "repo": sources["model"] or "",
                "revision": extras["revision"],
                "endpoint": extras["endpoint"],
                "include": list(extras["include"]),
                "name": name,
                "pin": pin,
                "header_files": headers,
            },
        )
    # Fields named as the options are: --model is the repo.
    bad = [
        FieldViolation(_MODEL_OPTION.get(v.field, v.field.removeprefix("model.")), v.description)
        for v in target_violations(kind, fields)
    ]
    if bad:
        raise InvalidSpec(f"--model: {bad[0].field}: {bad[0].description}", bad)
    return prewarm_spec(kind, fields)
