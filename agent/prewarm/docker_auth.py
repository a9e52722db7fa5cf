"""Registry credentials from a Docker ``config.json`` (``auths``), for CRI pulls and registry reads.

Credential helpers (credsStore/credHelpers) are not run: the agent does not execute binaries
named by a config file. Secrets never appear in a repr, an error or a log line.

The file is read on every authorization, so a change is seen at the next pull: at most
`MAX_CONFIG_BYTES` of it, as JSON, and checked whole (as Docker reads it): ``auths`` an object
of objects whose credential fields are strings. Anything else is an InvalidSpec naming
``prewarm.docker_config`` and the path in the file, never its values.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import capped, read_text

DOCKER_HUB = "docker.io"
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")
#: A docker config holds a few registries' entries: kilobytes
MAX_CONFIG_BYTES = 1024 * 1024
FIELD = "prewarm.docker_config"
#: An ``auths`` entry's credential fields: strings when present
_STRINGS = ("username", "password", "auth", "identitytoken", "registrytoken")


def registry_host(ref: str) -> str:
    """The registry of an image reference, with Docker's defaulting rules."""
    first, sep, _ = ref.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost"):
        return DOCKER_HUB
    return first


@dataclass(frozen=True, slots=True)
class Credentials:
    """One ``auths`` entry; ``auth`` is base64 ``user:pass`` as the file holds it."""

    server: str
    username: str = ""
    password: str = field(default="", repr=False)
    auth: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)


def credentials_for(ref: str, docker_config: Path | None) -> Credentials | None:
    """Credentials for the image's registry, or None (anonymous)."""
    if docker_config is None:
        return None
    auths = read_auths(docker_config)
    host = registry_host(ref)
    keys = _DOCKER_HUB_KEYS if host == DOCKER_HUB else (host,)
    for key, entry in auths.items():
        bare = key.removeprefix("https://").removeprefix("http://").split("/", 1)[0]
        if key in keys or bare in keys:
            username = entry.get("username", "")
            password = entry.get("password", "")
            auth = entry.get("auth", "")
            if auth and not username:
                try:
                    decoded = base64.b64decode(auth, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    raise _refused(
                        docker_config, f"{_entry(key)}.auth", "not base64 of user:password"
                    ) from None
                username, _, password = decoded.partition(":")
            return Credentials(
                server=host,
                username=username,
                password=password,
                auth=auth,
                identity_token=entry.get("identitytoken", ""),
                registry_token=entry.get("registrytoken", ""),
            )
    return None


def read_auths(docker_config: Path) -> dict[str, dict[str, str]]:
    """The file's ``auths``, read bounded and checked whole; InvalidSpec naming the field."""
    text = read_text(docker_config, FIELD, MAX_CONFIG_BYTES, what="docker config")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # deep nesting is a RecursionError
        why = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise _refused(docker_config, None, why) from None
    if not isinstance(data, dict):
        raise _refused(docker_config, None, "not a JSON object")
    auths = data.get("auths", {})
    if not isinstance(auths, dict):
        raise _refused(docker_config, "auths", "not an object of registries")
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            raise _refused(docker_config, _entry(key), "not an object")
        for name in _STRINGS:
            if not isinstance(entry.get(name, ""), str):
                raise _refused(docker_config, f"{_entry(key)}.{name}", "not a string")
    return auths


def _entry(key: str) -> str:
    return f"auths[{capped(key, 80)!r}]"


def _refused(docker_config: Path, where: str | None, why: str) -> InvalidSpec:
    """The refusal of the file: the field and the path in it, never a value of it."""
    name = f"{FIELD}: {where}" if where else FIELD
    return InvalidSpec(
        f"docker config {docker_config}: {where + ' ' if where else ''}{why}",
        [FieldViolation(name, why)],
    )
