"""Prewarm manifests: a versioned YAML/JSON list of files and images, parsed strictly.

version: 1
items:
  - url: https://models.example.com/llama/model.safetensors
    name: llama-8b
    sha256: 3f2a...
    pin: true
    header_files: {Authorization: /var/run/secrets/models/token}
  - image: registry.example.com/serving/vllm:0.6
    runtime_handler: nydus
    pull_policy: IfNotPresent      # or Always
    repull_hours: 6                # optional: pull a moving tag again once 6 h old
  - model: meta-llama/Llama-3.1-8B-Instruct   # a repo snapshot, warmed as one item
    revision: main
    endpoint: https://huggingface.co
    include: ["*.json", "*.safetensors", "tokenizer*"]
    header_files: {Authorization: /var/run/secrets/hf/header}
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm.model import FileRequest, GroupRequest, ImageRequest, PullPolicy

_FILE_KEYS = ("url", "name", "sha256", "pin", "header_files")
_MODEL_KEYS = ("model", "revision", "endpoint", "include", "name", "pin", "header_files")
_SOURCES = ("url", "image", "model")
_IMAGE_KEYS = ("image", "name", "runtime_handler", "pin", "pull_policy", "repull_hours")


Request = FileRequest | ImageRequest | GroupRequest
#: A manifest may list a whole model repository, so it gets more room than an RPC field.
LIMITS = safeyaml.Limits(max_bytes=8 * 1024 * 1024, max_nodes=200_000)
MAX_ITEMS = 10_000


def load_manifest(path: Path) -> list[Request]:
    try:
        text = safeyaml.read_text(path, "manifest", LIMITS.max_bytes)
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise InvalidSpec(
            f"cannot read manifest {path}: {why}", [FieldViolation("manifest", str(why))]
        ) from None
    return parse_manifest(safeyaml.load(text, "manifest", LIMITS))


def parse_manifest(data: Any) -> list[Request]:
    """Requests in manifest order; every violation is reported at once, with its field path."""
    errors: list[FieldViolation] = []
    if not isinstance(data, Mapping):
        raise InvalidSpec("manifest must be a mapping", [FieldViolation("", "version, items")])
    _unknown(data, ("version", "items"), "", errors)
    if data.get("version") != 1:
        errors.append(FieldViolation("version", "must be 1"))
    items = data.get("items")
    if not isinstance(items, list) or not items:
        errors.append(
            FieldViolation(
                "items", "a non-empty list of files (url), images (image), models (model)"
            )
        )
        items = []
    elif len(items) > MAX_ITEMS:
        errors.append(FieldViolation("items", f"at most {MAX_ITEMS} items, got {len(items)}"))
        items = []
    out: list[Request] = []
    for i, entry in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(entry, Mapping) or sum(k in entry for k in _SOURCES) != 1:
            errors.append(FieldViolation(where, "a mapping with exactly one of url, image, model"))
            continue
        request: Request | None
        if "url" in entry:
            request = _file(entry, where, errors)
        elif "image" in entry:
            request = _image(entry, where, errors)
        else:
            request = _model(entry, where, errors)
        if request is not None:
            out.append(request)
    if errors:
        raise InvalidSpec(f"manifest has {len(errors)} error(s)", errors)
    return out


def _file(entry: Mapping[str, Any], where: str, errors: list[FieldViolation]) -> FileRequest | None:
    if not _unknown(entry, _FILE_KEYS, where, errors):
        return None
    headers = entry.get("header_files") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        errors.append(FieldViolation(f"{where}.header_files", "a mapping header name -> file path"))
        return None
    fields = _strings(entry, ("url", "name", "sha256"), where, errors)
    pin = _bool(entry, where, errors)
    if fields is None or pin is None:
        return None
    return FileRequest(
        url=fields["url"] or "",
        name=fields["name"],
        sha256=fields["sha256"],
        pin=pin,
        header_files={k: Path(v) for k, v in headers.items()},
    )


def _headers(
    entry: Mapping[str, Any], where: str, errors: list[FieldViolation]
) -> dict[str, Path] | None:
    headers = entry.get("header_files") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        errors.append(FieldViolation(f"{where}.header_files", "a mapping header name -> file path"))
        return None
    return {k: Path(v) for k, v in headers.items()}


def _model(
    entry: Mapping[str, Any], where: str, errors: list[FieldViolation]
) -> GroupRequest | None:
    if not _unknown(entry, _MODEL_KEYS, where, errors):
        return None
    headers = _headers(entry, where, errors)
    fields = _strings(entry, ("model", "revision", "endpoint", "name"), where, errors)
    pin = _bool(entry, where, errors)
    include = entry.get("include") or []
    if not isinstance(include, list) or not all(isinstance(g, str) for g in include):
        errors.append(FieldViolation(f"{where}.include", "a list of globs"))
        return None
    if headers is None or fields is None or pin is None:
        return None
    return GroupRequest(
        repo=fields["model"] or "",
        revision=fields["revision"] or "main",
        endpoint=fields["endpoint"] or "https://huggingface.co",
        include=tuple(include),
        name=fields["name"],
        pin=pin,
        header_files=headers,
    )


def _image(
    entry: Mapping[str, Any], where: str, errors: list[FieldViolation]
) -> ImageRequest | None:
    if not _unknown(entry, _IMAGE_KEYS, where, errors):
        return None
    fields = _strings(entry, ("image", "name", "runtime_handler", "pull_policy"), where, errors)
    pin = _bool(entry, where, errors)
    if fields is None or pin is None:
        return None
    policy = fields["pull_policy"] or PullPolicy.IF_NOT_PRESENT.value
    if policy not in {p.value for p in PullPolicy}:
        allowed = ", ".join(p.value for p in PullPolicy)
        errors.append(FieldViolation(f"{where}.pull_policy", f"one of {allowed}"))
        return None
    hours = entry.get("repull_hours")
    if hours is not None and (
        isinstance(hours, bool) or not isinstance(hours, int | float) or hours <= 0
    ):
        errors.append(FieldViolation(f"{where}.repull_hours", "a number of hours > 0"))
        return None
    return ImageRequest(
        ref=fields["image"] or "",
        name=fields["name"],
        runtime_handler=fields["runtime_handler"],
        pin=pin,
        pull_policy=PullPolicy(policy),
        repull_hours=float(hours) if hours is not None else None,
    )


def _unknown(
    entry: Mapping[str, Any], allowed: tuple[str, ...], where: str, errors: list[FieldViolation]
) -> bool:
    ok = True
    for key in entry:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            path = f"{where}.{key}" if where else str(key)
            errors.append(FieldViolation(path, f"unknown key{hint}; allowed: {', '.join(allowed)}"))
            ok = False
    return ok


def _strings(
    entry: Mapping[str, Any], keys: tuple[str, ...], where: str, errors: list[FieldViolation]
) -> dict[str, str | None] | None:
    out: dict[str, str | None] = {}
    for key in keys:
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            errors.append(FieldViolation(f"{where}.{key}", "a string"))
            return None
        out[key] = value
    return out


def _bool(entry: Mapping[str, Any], where: str, errors: list[FieldViolation]) -> bool | None:
    value = entry.get("pin", False)
    if not isinstance(value, bool):
        errors.append(FieldViolation(f"{where}.pin", "true or false"))
        return None
    return value
