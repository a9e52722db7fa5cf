"""A /proc as an agent reads its own PID namespace there (agent/pidns.py)."""

from __future__ import annotations

from pathlib import Path

from agent.pidns import NODE_PID_NAMESPACE

#: ``readlink /proc/self/ns/pid`` in a pod without hostPID (any inode but the node's)
POD_NAMESPACE = "pid:[4026532175]"


def a_proc(root: Path, ns: str | None, nspid: str | None = None) -> Path:
    """``root``/self with ``ns/pid`` linked to ``ns`` (None: no link; a link there before is
    replaced) and a status whose ``NSpid:`` is ``nspid`` (None: no such line)."""
    (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
    (root / "self" / "ns" / "pid").unlink(missing_ok=True)
    if ns is not None:
        (root / "self" / "ns" / "pid").symlink_to(ns)
    line = "" if nspid is None else f"NSpid:\t{nspid}\n"
    (root / "self" / "status").write_text(f"Name:\tgpu-agent\nPid:\t7\n{line}")
    return root


def node_proc(root: Path) -> Path:
    """``root`` as the node's /proc: the agent has hostPID and sees every process there."""
    return a_proc(root, NODE_PID_NAMESPACE)
