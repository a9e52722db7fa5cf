"""``gpu-agent sim exec``: a program that cannot start is told apart from one that ran."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from agent.cli.context import CliContext
from agent.cli.sim import sim


def _exec(tmp_path: Path, program: str) -> tuple[int, str]:
    obj = CliContext(None, {"simulate": "h100-nvl", "state_dir": tmp_path / "node"}, env={})
    try:
        result = CliRunner().invoke(sim, ["exec", "--", program], obj=obj)
    finally:
        obj.close()
    return result.exit_code, result.output


def test_a_program_that_cannot_start_exits_127_or_126_not_1(tmp_path: Path) -> None:
    """`sim exec -- nvitopp` exited 1, the code the program itself exits with on failure, so a
    script could not tell a typo from a run that failed. As env(1): 127 when PROGRAM is not
    found, 126 when it is found but cannot run; the line says which."""
    code, said = _exec(tmp_path, "no-such-program-anywhere")
    assert code == 127, said
    assert "error: cannot run 'no-such-program-anywhere': No such file or directory" in said
    not_runnable = tmp_path / "data.txt"
    not_runnable.write_text("not a program\n")
    code, said = _exec(tmp_path, str(not_runnable))
    assert code == 126, said
    assert "Permission denied" in said
