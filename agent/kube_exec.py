"""Kubeconfig exec credential plugins (``users[].user.exec``): ``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin`` and the like.

The protocol is client-go's (client.authentication.k8s.io ``v1`` and ``v1beta1``): the plugin
runs with the kubeconfig's ``args`` and ``env`` over ours, ``KUBERNETES_EXEC_INFO`` holding an
ExecCredential whose ``spec`` says whether it may prompt (``interactive``) and, with
``provideClusterInfo``, the cluster; it prints an ExecCredential whose ``status.token`` is sent
as the bearer token until ``status.expirationTimestamp``, and again after a 401. No candidate
library bounds the plugin's run (docs/architecture.md), so this does: a plugin that is missing,
fails, hangs past ``timeout_s`` or prints something else is one line naming it, with its
stderr shortened and never its stdout (where a token would be).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec, PermissionDenied

__all__ = ["API_VERSIONS", "ExecPlugin", "ExecPluginError"]

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: stderr kept in the error line
STDERR_CHARS = 300
#: stdout read from a plugin (an ExecCredential is a few KiB); more is refused, unread
MAX_OUTPUT = 1 << 20
#: stderr kept from a plugin (the rest is drained, so a chatty one does not block on its pipe)
MAX_STDERR = 64 << 10
# What looks like a credential in a plugin's stderr: a JWT, a "Bearer x", a long opaque run.
_SECRETS = re.compile(
    r"eyJ[\w-]+\.[\w-]+\.[\w-]*|(?i:bearer)\s+\S+|k8s-aws-v1\.\S+|[A-Za-z0-9+/=_.-]{40,}"
)


class ExecPluginError(PermissionDenied):
    """The exec plugin gave no credential; the message is one line naming it."""


@dataclass
class ExecPlugin:
    command: str
    api_version: str
    # Out of the repr, which a traceback or a debug line may show: args and env may carry a
    # secret (--client-secret, AWS_SECRET_ACCESS_KEY), the cluster a proxy-url's password.
    args: tuple[str, ...] = field(default=(), repr=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    interactive_mode: str = "IfAvailable"
    install_hint: str = ""
    cluster: dict[str, Any] | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    #: which kubeconfig, for messages
    source: str = ""
    _token: str | None = field(default=None, repr=False)
    _expires: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        cluster: Mapping[str, Any],
        base: Path,
        timeout_s: float = 10.0,
        source: str = "",
    ) -> ExecPlugin:
        """From a kubeconfig's ``exec`` mapping; InvalidSpec naming the field it gets wrong."""

        def bad(name: str, want: str, got: object = None) -> InvalidSpec:
            got = spec.get(name) if got is None else got
            message = f"kubeconfig {source}: user exec {name} {got!r}: want {want}"
            return InvalidSpec(message, [FieldViolation(f"exec.{name}", want)])

        command, version = spec.get("command"), spec.get("apiVersion")
        if not isinstance(command, str) or not command:
            raise bad("command", "the plugin's program")
        if version not in API_VERSIONS:
            raise bad("apiVersion", " or ".join(API_VERSIONS))
        mode = spec.get("interactiveMode") or ("" if version.endswith("/v1") else "IfAvailable")
        if mode not in ("Never", "IfAvailable", "Always"):
            raise bad("interactiveMode", "Never, IfAvailable or Always (required by v1)")
        args, env = spec.get("args") or [], spec.get("env") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise bad("args", "a list of strings")
        pairs = [e for e in env if isinstance(e, dict)] if isinstance(env, list) else []
        if len(pairs) != len(env) or not all(isinstance(e.get("name"), str) for e in pairs):
            raise bad("env", "a list of {name, value}")
        for i, entry in enumerate(pairs):  # no process environment could hold the name
            if not entry["name"] or "=" in entry["name"] or "\0" in entry["name"]:
                raise bad(
                    f"env[{i}].name", "a variable name: set, without '=' or NUL", entry["name"]
                )
        if "/" in command and not os.path.isabs(command):
            command = str(base / command)  # as client-go: relative to the kubeconfig's folder
        return cls(
            command=command,
            api_version=version,
            args=tuple(args),
            env={str(e["name"]): str(e.get("value", "")) for e in pairs},
            interactive_mode=mode,
            install_hint=str(spec.get("installHint") or ""),
            cluster=_cluster_info(cluster, base) if spec.get("provideClusterInfo") else None,
            timeout_s=timeout_s,
            source=source,
        )

    @property
    def name(self) -> str:
        return os.path.basename(self.command)

    def token(self, refresh: bool = False) -> str:
        """The cached token while it has not expired, else the plugin's new one; ``refresh``
        (after a 401) runs the plugin whatever the cache says."""
        with self._lock:
            fresh = self._expires is None or time.time() < self._expires
            if self._token is None or refresh or not fresh:
                self._token, self._expires = self._run()
            return self._token

    def _fail(self, what: str) -> ExecPluginError:
        hint = f" ({self.install_hint.splitlines()[0]})" if self.install_hint else ""
        where = f" (kubeconfig {self.source})" if self.source else ""
        return ExecPluginError(f"kubeconfig exec plugin {self.name!r}{where}: {what}{hint}")

    def _run(self) -> tuple[str, float | None]:
        tty = sys.stdin is not None and sys.stdin.isatty()
        if self.interactive_mode == "Always" and not tty:
            raise self._fail("needs a terminal (interactiveMode: Always) and stdin is not one")
        interactive = tty and self.interactive_mode != "Never"
        info: dict[str, Any] = {"interactive": interactive}
        if self.cluster is not None:
            info["cluster"] = self.cluster
        exec_info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": info}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(exec_info)}
        out, err, code = self._spawn(env, interactive)
        if code != 0:
            raise self._fail(f"exited {code}: {_short(err) or 'no stderr'}")
        return self._parse(out)

    def _spawn(self, env: dict[str, str], interactive: bool) -> tuple[bytes, bytes, int]:
        try:
            proc = subprocess.Popen(
                [self.command, *self.args],
                env=env,
                stdin=None if interactive else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=None if interactive else subprocess.PIPE,  # its prompts reach the user
                start_new_session=not interactive,  # its children go with it on a timeout
            )
        except OSError as exc:
            raise self._fail(f"cannot run {self.command}: {exc.strerror}") from exc
        except ValueError as exc:  # a NUL in the command, an argument or a value
            raise self._fail(f"cannot run {self.command!r}: {exc}") from exc
        # Read as it comes, never more than the caps hold: a plugin that prints without end
        # costs the agent MAX_OUTPUT, not its memory.
        out = _Capped(proc.stdout, MAX_OUTPUT, on_over=lambda: _kill(proc))
        err = _Capped(proc.stderr, MAX_STDERR)
        try:
            proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise self._fail(f"no answer within {self.timeout_s:g} s; killed") from None
        finally:
            out.join()
            err.join()
        if out.over:
            raise self._fail(f"printed more than {MAX_OUTPUT} bytes on stdout; killed")
        return out.data, err.data, proc.returncode

    def _parse(self, out: bytes) -> tuple[str, float | None]:
        try:
            cred = json.loads(out)
        except ValueError:
            raise self._fail("printed no ExecCredential JSON on stdout") from None
        status = cred.get("status") if isinstance(cred, dict) else None
        if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
            raise self._fail("printed JSON that is not an ExecCredential (kind)")
        if cred.get("apiVersion") != self.api_version:
            raise self._fail(f"answered {cred.get('apiVersion')!r}, asked {self.api_version!r}")
        token = status.get("token") if isinstance(status, dict) else None
        if not isinstance(token, str) or not token:
            # client certificates from a plugin (status.clientCertificateData) are not taken
            raise self._fail("its ExecCredential has no status.token")
        stamp = status.get("expirationTimestamp") if isinstance(status, dict) else None
        if stamp is None:
            return token, None
        try:
            return token, datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise self._fail(f"status.expirationTimestamp {stamp!r} is not RFC 3339") from None


def _cluster_info(cluster: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The ExecCredential ``spec.cluster`` for ``provideClusterInfo``; a relative
    ``certificate-authority`` is relative to ``base``, the kubeconfig's folder (kubectl's
    rule, and the client's own CA's: agent/kubeconfig.py), never to the current directory."""
    info: dict[str, Any] = {"server": cluster.get("server", "")}
    ca = cluster.get("certificate-authority-data")
    path = cluster.get("certificate-authority")
    if not ca and isinstance(path, str) and path:
        try:  # no further than a PEM can be; unread, as unreadable, otherwise
            ca = base64.b64encode(
                safeyaml.read_bytes(base / path, "ca", safeyaml.MAX_PEM_BYTES)
            ).decode()
        except InvalidSpec:
            ca = None
    if ca:
        info["certificate-authority-data"] = ca
    for key, name in (
        ("insecure-skip-tls-verify", "insecure-skip-tls-verify"),
        ("tls-server-name", "tls-server-name"),
        ("proxy-url", "proxy-url"),
    ):
        if cluster.get(key):
            info[name] = cluster[key]
    extensions = cluster.get("extensions")
    for ext in extensions if isinstance(extensions, list) else []:
        if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = ext.get("extension")
    return info


def _short(err: bytes) -> str:
    """stderr as one short line, with anything that looks like a credential hidden."""
    text = " ".join(err.decode(errors="replace").split())
    # hidden before the cut: a credential cut in two would be too short to be recognised
    return safeyaml.capped(_SECRETS.sub("<redacted>", text), STDERR_CHARS)


class _Capped:
    """Reads a pipe to its end on a thread of its own, keeping its first ``cap`` bytes. Past
    them ``on_over`` runs and reading stops; without one the rest is read and dropped (so a
    chatty plugin does not block on a full pipe)."""

    def __init__(
        self, pipe: IO[bytes] | None, cap: int, on_over: Callable[[], None] | None = None
    ) -> None:
        self.data = b""
        self.over = False
        self._thread: threading.Thread | None = None
        if pipe is not None:
            self._thread = threading.Thread(
                target=self._read, args=(pipe, cap, on_over), daemon=True, name="exec-plugin"
            )
            self._thread.start()

    def _read(self, pipe: IO[bytes], cap: int, on_over: Callable[[], None] | None) -> None:
        kept = bytearray()
        with pipe:
            while chunk := os.read(pipe.fileno(), _CHUNK):
                room = cap - len(kept)
                kept += chunk[:room]
                if len(chunk) > room:
                    self.over = True
                    if on_over is not None:
                        on_over()
                        break
        self.data = bytes(kept)

    def join(self) -> None:
        if self._thread is not None:
            # a grandchild that keeps the pipe open (a session of its own) is not waited on
            self._thread.join(timeout=2)


_CHUNK = 64 << 10


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=2)
