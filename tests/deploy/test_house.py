"""The house's measure (scripts/measure-house, issue 37) holds on main."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

from agent.prewarm import kinds

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "measure-house"


def test_recipes_list_real_files_and_nothing_grew_past_its_limit() -> None:
    """Every recipe's Files line in docs/architecture.md names files that exist, counts them
    right, and lists every product file that names every prewarm kind by hand; no file grew
    over 700 lines nor a function over 80 beyond the known ones, which may only shrink."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "recipes (files edited):" in done.stdout


def test_the_check_fails_on_a_wrong_recipe_and_on_growth(tmp_path: Path) -> None:
    """The measure can fail: a missing path, a wrong count, an unlisted kind-naming file and a
    grown file are each named."""
    measure = runpy.run_path(str(SCRIPT))
    listed = {
        "Add a prewarm source kind": (2, ["agent/prewarm/source_<kind>.py", "docs/nowhere.md"]),
        "Add a metric": (3, ["dcgm/fields.py"]),
    }
    # Files that name every kind by hand again, as the CLIs and the coordinator's specs did
    # before issue 37: by request type, by option, by the API's target field. Made from the
    # registry, so a new kind is named by them too.
    schemas = kinds.schemas()
    types = ", ".join(s.request_type.__name__ for s in schemas)
    by_hand = {
        "cli.py": f"from agent.prewarm.model import {types}\n",
        "fleet.py": f"SOURCES = {tuple(s.manifest_source for s in schemas)!r}\n",
        "specs.py": f"TARGETS = {dict.fromkeys((s.kind for s in schemas), 1)!r}\n",
    }
    for name, text in by_hand.items():
        tmp_path.joinpath(name).write_text(text)
    problems = measure["recipe_problems"](listed, sorted(tmp_path.iterdir()))
    assert any("docs/nowhere.md does not exist" in p for p in problems), problems
    assert any("says 3 files, lists 1" in p for p in problems), problems
    for name in by_hand:
        assert any(f"{tmp_path / name} names every kind by hand" in p for p in problems)
    assert measure["kind_naming_files"]() == [], "a product file names every kind by hand"
    grown = measure["limit_problems"](
        {"agent/old.py": 10_000, "agent/new.py": 701}, known={"agent/old.py": 757}
    )
    assert any("grew past its known" in p for p in grown)
    assert any("agent/new.py: 701 lines, over the limit of 700" in p for p in grown)
