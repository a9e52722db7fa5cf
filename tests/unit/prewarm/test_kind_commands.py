"""A prewarm kind is data: its request's fields make its ``prewarm <kind>`` command and its
``fleet prewarm`` options (issue 37), so a kind reaches both CLIs without a line of CLI code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agent.cli import prewarm as prewarm_cli
from agent.cli.fleet import prewarm as fleet_prewarm
from agent.errors import InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.manifest import load_manifest
from agent.prewarm.model import GroupRequest, ImageRequest, PullPolicy


def _names(command: click.Command) -> set[str]:
    return {p.name for p in command.params if p.name}


@pytest.mark.parametrize("schema", kinds.schemas(), ids=lambda s: s.kind)
def test_every_kind_is_a_command_taking_its_source_and_its_fields(schema: Any) -> None:
    command = prewarm_cli.prewarm.commands[schema.kind]
    (argument,) = [p for p in command.params if isinstance(p, click.Argument)]
    assert argument.name == schema.source
    assert set(schema.fields) <= _names(command)
    assert command.help == schema.summary


def test_a_command_warms_the_request_its_options_say(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(
        prewarm_cli, "_warm", lambda ctx, requests, wait, output: sent.extend(requests)
    )
    args = ["model", "org/m", "--include", "*.json", "--include", "*.bin", "--header", "A=/s/a"]
    result = CliRunner().invoke(prewarm_cli.prewarm, [*args, "--pin", "--no-wait"])
    assert result.exit_code == 0, result.output
    assert sent == [
        GroupRequest(
            "org/m", include=("*.json", "*.bin"), pin=True, header_files={"A": Path("/s/a")}
        )
    ]
    sent.clear()
    args = ["image", "r.example/app:1", "--pull-policy", "Always", "--repull-hours", "6"]
    assert CliRunner().invoke(prewarm_cli.prewarm, args).exit_code == 0
    assert sent == [ImageRequest("r.example/app:1", pull_policy=PullPolicy.ALWAYS, repull_hours=6)]


def test_the_fleet_takes_each_kind_by_its_source_and_every_field() -> None:
    names = _names(fleet_prewarm.prewarm)
    for schema in kinds.schemas():
        assert schema.manifest_source in names
        assert set(schema.fields) - {schema.source} <= names


def test_the_fleet_sends_a_kinds_own_options_in_its_target() -> None:
    given = {f.name: None for f in fleet_prewarm._FIELDS}
    given.update(image="r.example/app:1", pull_policy="Always", repull_hours=6.0, name="app")
    spec = fleet_prewarm._prewarm_spec(given)
    assert spec == {
        "targets": [
            {
                "image": {
                    "ref": "r.example/app:1",
                    "name": "app",
                    "pullPolicy": "IMAGE_PULL_POLICY_ALWAYS",
                    "repullHours": 6.0,
                }
            }
        ]
    }


def test_a_relative_header_file_is_refused_naming_what_the_user_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A header file is read by the agent, on the node, from an absolute path. A relative one
    was sent on and refused by the API as 'targets[0].file.header_files[Authorization]: must be
    an absolute path on the node', naming neither `--header` nor the manifest's
    `items[0].header_files`. Each is now refused where the user wrote it, nothing sent."""
    sent: list[Any] = []
    monkeypatch.setattr(
        prewarm_cli, "_warm", lambda ctx, requests, wait, output: sent.extend(requests)
    )
    args = ["file", "https://h.example/m.bin", "--header", "Authorization=secrets/h"]
    result = CliRunner().invoke(prewarm_cli.prewarm, args)
    assert result.exit_code == 2 and sent == [], result.output
    assert "--header" in result.output and "absolute" in result.output, result.output
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "version: 1\nitems:\n  - url: https://h.example/m.bin\n"
        "    header_files: {Authorization: secrets/h}\n"
    )
    with pytest.raises(InvalidSpec) as bad:
        load_manifest(manifest)
    assert [v.field for v in bad.value.violations] == ["items[0].header_files"]
    assert "absolute" in bad.value.violations[0].description
