"""The docker config (``prewarm.docker_config``) is read bounded and shape-checked on every
authorization: whatever the file holds, a refusal is an InvalidSpec naming the field, never an
AttributeError or a RecursionError out of a pull, and never a secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import InvalidSpec
from agent.prewarm.docker_auth import MAX_CONFIG_BYTES, credentials_for

SECRET = "hunter2-do-not-show"


def _refusal(tmp_path: Path, text: str | bytes) -> InvalidSpec:
    cfg = tmp_path / "config.json"
    cfg.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(InvalidSpec) as refused:
        credentials_for("r.io/team/model:1", cfg)
    assert SECRET not in str(refused.value)
    return refused.value


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"auths": ["r.io"]}, "prewarm.docker_config: auths"),
        ({"auths": None}, "prewarm.docker_config: auths"),
        ([{"auths": {}}], "prewarm.docker_config"),
        ({"auths": {"r.io": ["u", SECRET]}}, "prewarm.docker_config: auths['r.io']"),
        # Another registry's entry too: as Docker, the file is read whole or not at all.
        ({"auths": {"other.io": SECRET}}, "prewarm.docker_config: auths['other.io']"),
        (
            {"auths": {"r.io": {"username": "u", "password": {"v": SECRET}}}},
            "prewarm.docker_config: auths['r.io'].password",
        ),
        ({"auths": {"r.io": {"auth": "!" + SECRET}}}, "prewarm.docker_config: auths['r.io'].auth"),
        (
            {"auths": {"https://r.io/v2/": {"auth": 12345}}},
            "prewarm.docker_config: auths['https://r.io/v2/'].auth",
        ),
    ],
)
def test_a_config_of_the_wrong_shape_is_refused_naming_the_field(
    tmp_path: Path, doc: object, field: str
) -> None:
    refused = _refusal(tmp_path, json.dumps(doc))
    assert [v.field for v in refused.violations] == [field], refused


def test_a_config_too_large_is_refused_without_being_read(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    with cfg.open("wb") as f:  # sparse: 1 GiB that costs no disk, and must cost no memory
        f.truncate(1024 * 1024 * 1024)
    with pytest.raises(InvalidSpec) as refused:
        credentials_for("r.io/x:1", cfg)
    assert [v.field for v in refused.value.violations] == ["prewarm.docker_config"]
    assert f"at most {MAX_CONFIG_BYTES} bytes" in str(refused.value.violations[0].description)


@pytest.mark.parametrize(
    "text", ["[" * 200_000, '{"auths": {"r.io": {"auth": 1' + "0" * 5000 + "}}}", "\xff{}"]
)
def test_deep_nesting_huge_numbers_and_bad_text_are_refused_naming_the_setting(
    tmp_path: Path, text: str
) -> None:
    refused = _refusal(tmp_path, text.encode("latin-1"))
    assert [v.field for v in refused.violations] == ["prewarm.docker_config"]


def test_a_well_formed_config_still_gives_the_registrys_credentials(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    auths = {
        "other.io": {"auth": "b3RoZXI6eA=="},
        "https://r.io/v1/": {"username": "u", "password": SECRET, "identitytoken": "t"},
    }
    cfg.write_text(json.dumps({"auths": auths, "credsStore": "desktop"}, indent="\t"))
    creds = credentials_for("r.io/team/model:1", cfg)
    assert creds is not None
    assert (creds.server, creds.username, creds.password, creds.identity_token) == (
        "r.io",
        "u",
        SECRET,
        "t",
    )
    assert credentials_for("elsewhere.io/x:1", cfg) is None
    assert SECRET not in repr(creds)
