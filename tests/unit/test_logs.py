"""Log lines cannot be forged: every control character of a logged value comes out escaped, in
one place (agent/logs.py) that every logger of the process goes through."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import logs
from tests.unit.api.support import REPO

FORGED = "2030-01-01 00:00:00,000 CRITICAL agent.node: forged"


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    root, agent = logging.getLogger(), logging.getLogger("agent")
    saved = (root.handlers[:], root.level, agent.level)
    agent.setLevel(logging.NOTSET)  # an embedded agent of an earlier test quiets "agent"
    stream = io.StringIO()
    logs.configure("info", stream=stream)
    try:
        yield stream
    finally:
        root.handlers[:], root.level, _ = saved
        agent.setLevel(saved[2])


def test_control_characters_of_a_value_are_escaped(output: io.StringIO) -> None:
    """What the attack run logged raw: an origin's status line with ESC and CR, a URL."""
    logging.getLogger("agent.prewarm.fetch_http").warning(
        "origin answered %s for %s", "200 \x1b[2J\x1b[31mOK\r", "https://h/x\n" + FORGED
    )
    text = output.getvalue()
    assert text.count("\n") == 1
    assert "200 \\x1b[2J\\x1b[31mOK\\r for https://h/x\\n" + FORGED in text
    assert "\x1b" not in text and "\r" not in text


def test_the_message_itself_and_other_separators_are_escaped(output: io.StringIO) -> None:
    logging.getLogger("agent.api.interceptor").error("a\x00b\x7fc\x85d\u2028e\tf\nG")
    assert output.getvalue().endswith("a\\x00b\\x7fc\\x85d\\u2028e\\tf\\nG\n")


def test_a_traceback_keeps_its_lines_and_escapes_the_exception_message(
    output: io.StringIO,
) -> None:
    try:
        try:
            raise OSError("first\r\n" + FORGED)
        except OSError as exc:
            raise ValueError("second\n" + FORGED) from exc
    except ValueError:
        logging.getLogger("agent.node").exception("it failed for %s", "x\ny")
    lines = output.getvalue().splitlines()
    assert lines[0].endswith("ERROR agent.node: it failed for x\\ny")
    assert "Traceback (most recent call last):" in lines
    assert "OSError: first\\r\\n" + FORGED in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1] == "ValueError: second\\n" + FORGED
    assert not any(line.startswith(FORGED) for line in lines)
    assert any(line.startswith('  File "') for line in lines)  # frames as Python prints them


def test_other_handlers_see_the_record_unchanged(output: io.StringIO) -> None:
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    logging.getLogger("agent").warning("%s", "a\nb")
    assert seen[0].getMessage() == "a\nb"
    assert "a\\nb" in output.getvalue()


def test_every_cli_command_logs_through_it() -> None:
    """A warning from a command that set up no logging of its own is escaped too (Python's
    last-resort handler printed it raw)."""
    code = (
        "import logging, click\n"
        "from agent.cli import main\n"
        "warn = click.Command('warn', callback=lambda: "
        "logging.getLogger('agent.x').warning('%s', 'a\\n\\x1bb'))\n"
        "main._COMMANDS['warn'] = ('__main__', 'warn')\n"
        "main.main(['warn'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "a\\n\\x1bb\n"


def test_a_stopped_embedded_agent_gives_the_host_its_log_level_back(tmp_path: Path) -> None:
    """A process that embeds an agent (the CLI, a test) logs as before once the agent stops."""
    from agent.config import AgentConfig
    from agent.embedded import EmbeddedAgent

    agent_log = logging.getLogger("agent")
    agent_log.setLevel(logging.INFO)
    try:
        embedded = EmbeddedAgent(AgentConfig(simulate="dgx-h100", state_dir=tmp_path / "s"))
        embedded.start()
        assert agent_log.level > logging.CRITICAL  # the agent's log is not the command's output
        embedded.stop()
        assert agent_log.level == logging.INFO
    finally:
        agent_log.setLevel(logging.NOTSET)
