"""docs/configuration.md is generated from the config schema and up to date."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from agent.config import AgentConfig, config_schema, load_config
from tests.deploy.conftest import REPO, run

PAGE = REPO / "docs" / "configuration.md"
SCRIPT = REPO / "scripts" / "gen-config-docs"


def test_configuration_page_is_fresh() -> None:
    """Fails when agent/config/ changed and the page was not regenerated."""
    result = run([sys.executable, str(SCRIPT), "--check"])
    assert result.returncode == 0, result.stderr or result.stdout


def test_every_setting_is_documented() -> None:
    text = PAGE.read_text()
    for row in config_schema():
        assert f"### {row['key']}\n" in text, row["key"]
        assert f"`{row['env']}`" in text, row["env"]


def test_the_example_file_is_a_valid_config_of_the_defaults(tmp_path: Path) -> None:
    """The page's "every setting at its default" file loads, and changes nothing."""
    text = PAGE.read_text()
    (block,) = re.findall(r"## Every setting at its default.*?```yaml\n(.*?)```", text, re.DOTALL)
    assert isinstance(yaml.safe_load(block), dict)
    file = tmp_path / "config.yaml"
    file.write_text(block)
    loaded = load_config(file, {}, {})
    defaults = load_config(None, {}, {})
    assert loaded == defaults
    assert isinstance(loaded, AgentConfig)
