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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.source import SourceRequest
from agent.prewarm.target import TargetSchema, unknown_keys

Request = SourceRequest
#: A manifest may list a whole model repository, so it gets more room than an RPC field.
LIMITS = safeyaml.Limits(max_bytes=8 * 1024 * 1024, max_nodes=200_000)
MAX_ITEMS = 10_000


def load_manifest(path: Path) -> list[Request]:
    text = safeyaml.read_text(path, "manifest", LIMITS.max_bytes)
    return parse_manifest(safeyaml.load(text, "manifest", LIMITS))


def parse_manifest(data: Any) -> list[Request]:
    """Requests in manifest order; every violation is reported at once, with its field path.
    Each entry is a target of the registered kind whose key it has (agent/prewarm/target.py)."""
    errors: list[FieldViolation] = []
    if not isinstance(data, Mapping):
        raise InvalidSpec("manifest must be a mapping", [FieldViolation("", "version, items")])
    unknown_keys(data, ("version", "items"), "", errors)
    if data.get("version") != 1:
        errors.append(FieldViolation("version", "must be 1"))
    schemas = kinds.schemas()
    items = data.get("items")
    if not isinstance(items, list) or not items:
        listed = ", ".join(f"{s.plural} ({s.manifest_source})" for s in schemas)
        errors.append(FieldViolation("items", f"a non-empty list of {listed}"))
        items = []
    elif len(items) > MAX_ITEMS:
        errors.append(FieldViolation("items", f"at most {MAX_ITEMS} items, got {len(items)}"))
        items = []
    out: list[Request] = []
    for i, entry in enumerate(items):
        where = f"items[{i}]"
        which: list[TargetSchema] = []
        if isinstance(entry, Mapping):
            which = [s for s in schemas if s.manifest_source in entry]
        if len(which) != 1:
            keys = ", ".join(s.manifest_source for s in schemas)
            errors.append(FieldViolation(where, f"a mapping with exactly one of {keys}"))
            continue
        (schema,) = which
        request = schema.parse(entry, where, errors, schema.manifest_names)
        if request is not None:
            out.append(request)
    if errors:
        raise InvalidSpec(f"manifest has {len(errors)} error(s)", errors)
    return out
