"""The one test command fails on a skip: a test that cannot run in CI is a claim nobody checked
(tests/strict_skips.py; README, "Quick start")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.strict_skips import ENV

REPO = Path(__file__).resolve().parents[2]

SUITE = {
    "conftest.py": (
        "from tests import strict_skips\n"
        "strict_skips.ALLOWED_SKIPS['no GPU here'] = 'the test needs a real GPU'\n"
    ),
    "test_some.py": (
        "import pytest\n"
        "def test_runs(): pass\n"
        "def test_skips_in_its_body(): pytest.skip('containerd is not installed')\n"
        "@pytest.mark.skipif(True, reason='needs root')\n"
        "def test_skips_by_its_mark(): pass\n"
        "def test_allowed(): pytest.skip('no GPU here')\n"
        "@pytest.mark.xfail(reason='a known bug', strict=True)\n"
        "def test_expected_to_fail(): assert False\n"
    ),
    "test_whole_module.py": "import pytest\npytest.importorskip('no_such_module_anywhere')\n",
}


def _run(tmp_path: Path, strict: bool) -> str:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(PYTHONPATH=str(REPO), **({ENV: "1"} if strict else {}))
    pytest = [sys.executable, "-m", "pytest", "-p", "tests.strict_skips", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*pytest, "--continue-on-collection-errors"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


def test_a_skip_fails_the_strict_run_unless_its_reason_is_allowed(tmp_path: Path) -> None:
    out = _run(tmp_path, strict=True)
    # Skipped in a test's body, at setup by a mark, and a whole module as it is imported: a
    # failure, an error, an error; each says why, and what to do.
    summary = "1 failed, 1 passed, 1 skipped, 1 xfailed, 2 errors"
    assert summary in out.splitlines()[-1], out
    for reason in ("containerd is not installed", "needs root", "'no_such_module_anywhere'"):
        assert f"{reason}: a skip fails under {ENV}=1 (scripts/test)" in out, reason
    assert "1 passed, 4 skipped, 1 xfailed" in _run(tmp_path, strict=False).splitlines()[-1]


def test_the_test_command_runs_strict() -> None:
    assert f"export {ENV}=1" in (REPO / "scripts" / "test").read_text()
