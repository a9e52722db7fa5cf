"""The agent's error tree, grouped by what the caller does next.

Domain code raises these; ``api/`` maps them to gRPC status codes in one place and the CLI maps
them to exit codes. They carry data, never transport types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad input: the field path and what is wrong with it."""

    field: str
    description: str

    def __str__(self) -> str:
        """``field: description`` (the description alone for no field), how every refusal
        reads it in one line."""
        return f"{self.field}: {self.description}" if self.field else self.description


class InvalidSpec(AgentError):
    """The input is wrong; fix it and retry. Nothing was changed."""

    exit_code = 2

    def __init__(self, message: str, violations: Sequence[FieldViolation] = ()) -> None:
        super().__init__(message)
        self.violations = tuple(violations)

    @classmethod
    def of(cls, source: str, violations: Sequence[FieldViolation]) -> InvalidSpec:
        """``source: <the first violation> (and N more)``, carrying every one of them."""
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        return cls(f"{source}: {violations[0]}{more}", violations)

    def renamed(self, fields: Mapping[str, str]) -> InvalidSpec:
        """The same refusal naming the caller's own fields (a CLI flag for an API field)."""
        return InvalidSpec(
            str(self),
            [FieldViolation(fields.get(v.field, v.field), v.description) for v in self.violations],
        )


def check_each(items: Sequence[T], check: Callable[[T], None], what: str = "items") -> None:
    """Run ``check`` on every item; refuse with every refused item's fields under
    ``what[i].``, so the author of a list learns which items and all of them at once. A
    single item's refusal is raised as it is."""
    if len(items) == 1:
        check(items[0])
        return
    refused: list[tuple[int, InvalidSpec]] = []
    for i, item in enumerate(items):
        try:
            check(item)
        except InvalidSpec as exc:
            refused.append((i, exc))
    if refused:
        first, why = refused[0]
        raise InvalidSpec(
            f"{len(refused)} of {len(items)} {what} refused; {what}[{first}]: {why}",
            [
                FieldViolation(f"{what}[{i}].{v.field}".rstrip("."), v.description)
                for i, exc in refused
                for v in exc.violations or (FieldViolation("", str(exc)),)
            ],
        )


class NotFound(AgentError):
    """The named GPU, instance, operation or item does not exist."""

    exit_code = 3


class Conflict(AgentError):
    """The request contradicts the current state (e.g. a layout that cannot fit)."""

    exit_code = 4


class Busy(AgentError):
    """Work is in the way: running processes, or another reconfiguration holds the node.

    ``blockers`` names what blocks (process ids, the running operation), so a caller can act.
    """

    exit_code = 5

    def __init__(self, message: str, blockers: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.blockers = tuple(blockers)


class Claimed(Busy):
    """Another coordinator's claim covers the node (agent.mig.claim): retry once it ends."""


class NotSupported(AgentError):
    """This node or GPU lacks the feature (no MIG, no GPM, ...)."""

    exit_code = 6


class DeviceLost(AgentError):
    """The GPU fell off the bus or the driver stopped answering; a human must look."""

    exit_code = 7


class PermissionDenied(AgentError):
    """The caller (or the agent itself) lacks the privilege for this action."""

    exit_code = 8


class DriverUnavailable(AgentError):
    """No NVML library or driver: the agent cannot talk to GPUs at all."""

    exit_code = 9


class StateUnavailable(AgentError):
    """The agent's state dir cannot take a write (read-only, full, or failing); nothing changed.

    The message names the directory and what to do; the agent goes on serving reads.
    """

    exit_code = 10


class DriverNotReady(AgentError):
    """A GPU feature was asked for while the NVIDIA driver is not attached (not loaded yet, or
    going away in an upgrade). A state of the running agent, not a fault: everything that needs
    no GPU keeps working, and the feature works once the agent attaches (docs/operations.md)."""

    exit_code = 11


class ModeRefused(AgentError):
    """A change this node's GPU allocation mode forbids (a DRA driver that makes MIG instances
    itself), or one that depends on a mode the agent has not been able to detect yet. Nothing
    changed; the message names the mode and its evidence (docs/dra.md)."""

    exit_code = 12
