"""What the ``gpu-agent mig`` commands share: the mig-parted config file they take (``-f FILE
-c NAME``, read once) and the exit status of a mode change left pending."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from agent import safeyaml
from agent.cli.options import read_input
from agent.mig.spec import MigSpec, load_spec

F = TypeVar("F", bound=Callable[..., Any])

#: ``mig apply``/``restore`` exit status when the layout is not reached because a MIG mode change
#: waits for a GPU reset or a VM reboot (``mig plan`` when it would, a VM reboot pending): not
#: success (0), and not any error's code. It was 11, which is also DriverNotReady's: a script
#: resetting GPUs on 11 did so on a node with no driver. docs/mig.md "Exit codes", docs/api.md.
PENDING_EXIT = 14


def config_options(fn: F) -> F:
    """``-f FILE`` and ``-c NAME``, with mig-parted's environment variables."""
    fn = click.option(
        "--selected-config",
        "-c",
        "selected",
        envvar="MIG_PARTED_SELECTED_CONFIG",
        metavar="NAME",
        help="Config in the file to use; optional when the file has only one "
        "(env MIG_PARTED_SELECTED_CONFIG).",
    )(fn)
    return click.option(
        "--config-file",
        "-f",
        "config_file",
        envvar="MIG_PARTED_CONFIG_FILE",
        required=True,
        metavar="FILE",
        help="mig-parted v1 config file, '-' for stdin (env MIG_PARTED_CONFIG_FILE).",
    )(fn)


def load_with_text(config_file: str) -> tuple[MigSpec, str]:
    """The parsed config and the very text parsed (to hand to the agent): the file is read
    once, so a pipe (``-f <(...)``, stdin) or a file changed meanwhile sends what was checked."""
    if config_file == "-":
        text = read_input("-", "config-file")
        return load_spec("<stdin>", text), text
    # unreadable, too big or not UTF-8: a clear error naming config-file
    text = safeyaml.read_text(Path(config_file), "config-file", what="MIG config")
    return load_spec(config_file, text), text
