"""Registry credentials from a Docker ``config.json`` (``auths``), for CRI pulls and registry reads.

Credential helpers (credsStore/credHelpers) are not run: the agent does not execute binaries
named by a config file. Secrets never appear in a repr, an error or a log line.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import InvalidSpec

DOCKER_HUB = "docker.io"
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")


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
    try:
        auths = json.loads(docker_config.read_text()).get("auths", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidSpec(f"cannot read docker config {docker_config}: {exc}") from None
    host = registry_host(ref)
    keys = _DOCKER_HUB_KEYS if host == DOCKER_HUB else (host,)
    for key, entry in auths.items():
        bare = key.removeprefix("https://").removeprefix("http://").split("/", 1)[0]
        if (key in keys or bare in keys) and isinstance(entry, dict):
            username = str(entry.get("username", ""))
            password = str(entry.get("password", ""))
            auth = str(entry.get("auth", ""))
            if auth and not username:
                try:
                    decoded = base64.b64decode(auth, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    raise InvalidSpec(
                        f"docker config {docker_config}: auths[{key!r}].auth is not base64 "
                        "of user:password"
                    ) from None
                username, _, password = decoded.partition(":")
            return Credentials(
                server=host,
                username=username,
                password=password,
                auth=auth,
                identity_token=str(entry.get("identitytoken", "")),
                registry_token=str(entry.get("registrytoken", "")),
            )
    return None
