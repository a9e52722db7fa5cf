"""The checks of the API duty: the Unix socket's directory (by the rule the start refuses by,
agent/api/socket_dir.py), the mTLS material and its expiry, and who holds a role."""

from __future__ import annotations

import os
import ssl
import stat
import time
from pathlib import Path
from typing import Any

from agent.api.socket_dir import directory_problem
from agent.doctor.facts import Facts, degraded, failed, ok
from agent.wire.doctor import Check

__all__ = ["api_roles", "api_socket_dir", "api_tls"]

A = "api"
#: A serving certificate that expires sooner than this is degraded (cert-manager renews at 2/3).
EXPIRY_WARN_S = 7 * 86400


def api_socket_dir(facts: Facts) -> Check:
    socket = facts.socket_path
    directory = socket.parent
    if not os.path.lexists(directory):
        return ok(A, "socket-dir", f"{directory} absent: the agent makes it 0700 when it starts")
    found = directory_problem(directory)
    if found is not None:
        problem, fix = found
        return failed(
            A,
            "socket-dir",
            f"{problem}: another user could replace the socket; the agent refuses to serve",
            fix,
        )
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    serving = "serving" if _is_socket(socket) else "no socket yet"
    return ok(A, "socket-dir", f"{directory} mode {mode:04o}, owner trusted; {socket} {serving}")


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def _not_after(cert: Path) -> float:
    """The certificate's notAfter (Unix time), read with the interpreter's own decoder."""
    decode: Any = ssl._ssl._test_decode_cert  # type: ignore[attr-defined]  # no other stdlib way
    return float(ssl.cert_time_to_seconds(decode(str(cert))["notAfter"]))


def api_tls(facts: Facts) -> Check:
    tls = facts.config.tls
    if tls.cert_file is None or tls.key_file is None:
        return ok(A, "tls", "mTLS off: the API serves the local socket only")
    missing = [str(p) for p in (tls.cert_file, tls.key_file, tls.ca_file) if p and not p.is_file()]
    if tls.ca_file is None or missing:
        what = ", ".join(missing) or "tls.ca_file unset"
        return failed(
            A,
            "tls",
            f"mTLS material missing: {what}",
            "mount the cert-manager Secret (tls.crt, tls.key, ca.crt) and set tls.cert_file, "
            "tls.key_file, tls.ca_file",
        )
    try:
        left = _not_after(tls.cert_file) - time.time()
    except (OSError, ValueError, KeyError, ssl.SSLError) as exc:
        return failed(A, "tls", f"{tls.cert_file} does not decode: {exc}", "reissue it")
    evidence = f"{tls.cert_file}, expires in {left / 86400:.1f} day(s); CA {tls.ca_file}"
    if left <= 0:
        return failed(
            A,
            "tls",
            f"{tls.cert_file} expired {-left / 86400:.1f} day(s) ago",
            "renew it: cmctl renew gpu-agent -n gpu-agent (cert-manager) or reissue",
        )
    if left < EXPIRY_WARN_S:
        return degraded(
            A, "tls", evidence, "check cert-manager renews it: kubectl get certificate -A"
        )
    return ok(A, "tls", evidence)


def api_roles(facts: Facts) -> Check:
    roles = facts.config.roles
    held = {
        name: getattr(roles, name)
        for name in ("read", "prewarm", "sharing", "mig", "power", "admin")
        if getattr(roles, name)
    }
    said = "; ".join(f"{k}: {', '.join(v)}" for k, v in held.items()) or "no role held"
    tls_on = facts.config.tls.cert_file is not None
    if tls_on and not any(k != "read" for k in held):
        return degraded(
            A,
            "roles",
            f"{said}: no identity may change this node over mTLS (fleet apply is refused)",
            "give the coordinator's identity the roles it rolls out, e.g. roles.mig: "
            "[gpu-agent-coordinator]",
        )
    return ok(A, "roles", said + ("" if tls_on else " (local socket: root holds every role)"))
