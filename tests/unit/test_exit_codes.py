"""The CLI's exit codes (docs/api.md, "The CLI's exit code"): a script branches on them, so a
code names one outcome of the command that returns it.

Two collisions were found by a user's script, not by a test: `mig apply` exited 11 both for a
MIG mode change pending a reset and for a node without a driver (a script resetting GPUs on 11
did so on a node with no driver), and a failed download exited 10, the code of a state dir that
takes no writes.
"""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from agent.cli.mig import PENDING_EXIT, mig
from agent.cli.share import NOT_RELOADED_EXIT
from agent.errors import AgentError
from agent.prewarm import errors as prewarm_errors

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _domain_errors() -> dict[type[AgentError], int]:
    """The domain errors (agent/errors.py and prewarm's, which every node command and the API
    share), by their codes; subclasses that keep their base's code are its outcome, told apart
    by the message. A command's own codes (fleet's 10 and 11, mig's PENDING_EXIT) are not."""
    assert prewarm_errors.FetchFailed  # imported so that its classes are subclasses
    seen: dict[type[AgentError], int] = {}
    todo = [AgentError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith(("agent.errors", "agent.prewarm.errors")):
            seen[cls] = cls.exit_code
    return seen


def test_every_node_error_has_a_code_of_its_own_or_its_bases() -> None:
    by_code: dict[int, set[type[AgentError]]] = {}
    for cls, code in _domain_errors().items():
        # The outcome is the first class up the tree that sets this code.
        root = next(c for c in reversed(cls.__mro__) if vars(c).get("exit_code") == code)
        by_code.setdefault(code, set()).add(root)
    shared = {code: sorted(c.__name__ for c in roots) for code, roots in by_code.items()}
    assert {code: names for code, names in shared.items() if len(names) > 1} == {}


def test_a_pending_mig_mode_change_is_no_errors_code() -> None:
    assert PENDING_EXIT not in set(_domain_errors().values())


def test_a_sharing_change_not_reloaded_is_no_errors_code_nor_another_commands() -> None:
    assert NOT_RELOADED_EXIT not in {*_domain_errors().values(), PENDING_EXIT, 10, 11, 20, 21}
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", DOCS.read_text(), re.MULTILINE))
    assert "not reloaded" in rows[str(NOT_RELOADED_EXIT)]


def test_the_documented_table_names_each_error_at_its_code() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", DOCS.read_text(), re.MULTILINE))
    for cls, code in _domain_errors().items():
        if cls is AgentError or "exit_code" not in vars(cls):
            continue  # 1, "any other", or its base's outcome, documented there
        assert f"`{cls.__name__}`" in rows.get(str(code), ""), (cls.__name__, code)
    assert "pending" in rows[str(PENDING_EXIT)]


def test_the_commands_that_can_leave_a_mode_pending_say_its_code_in_their_help() -> None:
    """Their --help said 11 after the code moved to 14."""
    for command in ("apply", "restore"):
        shown = CliRunner().invoke(mig, [command, "--help"])
        assert shown.exit_code == 0, shown.output
        assert f"Exits {PENDING_EXIT}" in " ".join(shown.output.split()), command
