"""A registry account for the tests of private images: the htpasswd line docker-registry checks
and the Docker config.json the agent reads its credentials from."""

from __future__ import annotations

import base64
import json
from pathlib import Path

USER, PASSWORD = "alice", "s3cret-registry-pw"
# bcrypt of PASSWORD (the registry's htpasswd accepts bcrypt only)
HTPASSWD = f"{USER}:$2b$12$VXcEQgB5m8IA8uWDJ1noy.bw.f7ga1Z5jS593ozeN0xrUNGL5CmZG\n"


def docker_config(path: Path, registry: str, password: str = PASSWORD) -> Path:
    """A config.json whose ``auths`` entry for ``registry`` is USER:password."""
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    return path
