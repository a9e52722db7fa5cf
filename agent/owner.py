"""Who did a piece of work, and who may undo it: the owner of a cache item or an operation.

A caller acts under one role: ``admin`` (the node's admin on the Unix socket, the coordinator)
or the role of the work's kind (``prewarm`` for cache items and prewarm operations, ``mig`` for
MIG reconfigurations). Work done by an admin can be undone (unpinned, evicted, deleted,
cancelled) only by an admin; work done under another role can be undone by that role or by an
admin. The owner is recorded with the work (agent/state/schema.py, migration 3); a refusal
names the owner's role, never its identity (a certificate's SAN says who runs where).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import PermissionDenied

__all__ = ["ADMIN", "Actor", "check_may_undo", "claimed_by"]

ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Actor:
    """The caller of a change: its identity (a SAN, or ``local`` for the Unix socket) and the
    role it acts under."""

    identity: str
    role: str

    def outranks(self, owner_role: str | None) -> bool:
        """Whether work owned under ``owner_role`` (None: no owner recorded) is this actor's to
        undo."""
        return owner_role != ADMIN or self.role == ADMIN


def check_may_undo(actor: Actor | None, owner_role: str | None, what: str, verb: str) -> None:
    """Raise `PermissionDenied` when ``actor`` may not ``verb`` ``what``; None is the agent
    itself (its own cleanup), which always may."""
    if actor is None or actor.outranks(owner_role):
        return
    raise PermissionDenied(
        f"{what} belongs to an {owner_role} caller; a {actor.role} caller may not {verb} it "
        f"(ask an {owner_role})"
    )


def claimed_by(
    actor: Actor | None, owner: str | None, owner_role: str | None
) -> tuple[str | None, str | None]:
    """The owner after ``actor`` asked for the work again (submitted or pinned it): the first
    owner stays unless ``actor`` ranks above it, so an admin's repeat protects the work."""
    if actor is None:
        return owner, owner_role
    if owner_role is None or (actor.role == ADMIN and owner_role != ADMIN):
        return actor.identity, actor.role
    return owner, owner_role
