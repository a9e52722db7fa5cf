"""Which PID namespace the agent runs in: the node's (hostPID), where it sees the node's
processes (the device plugin's, the pods reading the cache), or its pod's own, where it cannot.

``<proc>/self/ns/pid`` names the namespace, and the node's (the initial one) has a fixed inode,
``PROC_PID_INIT_INO`` (include/linux/proc_ns.h, since Linux 3.8). ``NSpid:`` in
``<proc>/self/status`` lists the process's pid in each namespace from the one that /proc was
mounted for down to its own: a container's own /proc is mounted for its namespace and lists
one pid, so NSpid alone cannot tell; it says "child" only where the link cannot be read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

#: ``readlink /proc/self/ns/pid`` in the node's PID namespace.
NODE_PID_NAMESPACE = "pid:[4026531836]"

Namespace = Literal["node", "child", ""]


def namespace(proc: Path) -> Namespace:
    """``node``, ``child``, or "" when ``proc`` does not say."""
    try:
        link = os.readlink(proc / "self" / "ns" / "pid")
    except OSError:
        link = ""
    if link.startswith("pid:["):
        return "node" if link == NODE_PID_NAMESPACE else "child"
    return "child" if len(_nspid(proc)) > 1 else ""


def hides(proc: Path) -> bool:
    """Whether the node's processes, the device plugin's among them, are known not visible
    here (a pod without hostPID). False when ``proc`` does not say: an unseen plugin then reads
    as not running, as it did before this was read."""
    return namespace(proc) == "child"


def sees_node(proc: Path) -> bool:
    """Whether the node's processes are known visible here (hostPID). False when ``proc`` does
    not say: a scan that must see every process (whether a file is in use) rules out no one."""
    return namespace(proc) == "node"


def _nspid(proc: Path) -> tuple[int, ...]:
    """This process's pid in each PID namespace below /proc's (``NSpid:``, Linux 4.1 on)."""
    try:
        lines = (proc / "self" / "status").read_text().splitlines()
    except OSError:
        return ()
    for line in lines:
        if line.startswith("NSpid:"):
            try:
                return tuple(int(pid) for pid in line.split()[1:])
            except ValueError:
                return ()
    return ()
