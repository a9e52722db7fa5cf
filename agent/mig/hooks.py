"""mig-parted's hooks file (its ``api/hooks/v1``): commands run around an apply.

```yaml
version: v1
hooks:
  apply-start:
    - workdir: /etc/nvidia-mig-manager
      command: /bin/bash
      args: ["-x", "-c", "source hooks.sh; apply-start ${MIG_PARTED_SELECTED_CONFIG}"]
      envs: {FOO: bar}
```

The same semantics as mig-parted (``cmd/nvidia-mig-parted/apply``): ``apply-start`` first,
``apply-exit`` last and always once ``apply-start`` ran; ``pre-apply-mode`` only when the MIG mode
must change, before it changes; ``pre-apply-config`` only when the instances must change, before
they change. Hooks of one name run in order and the first failure stops the apply. A hook's
environment is its ``envs`` plus the command's ``MIG_PARTED_*`` settings (not the caller's
environment, as in mig-parted); its output is shown with ``--debug`` only. Stricter than
mig-parted: unknown keys and hook names are errors, and the file is bounded.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent import safeyaml
from agent.errors import AgentError, FieldViolation, InvalidSpec

HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
_MAX_BYTES = 64 * 1024
_MAX_HOOKS = 64
_HOOK_KEYS = ("command", "args", "envs", "workdir")

R = TypeVar("R")
log = logging.getLogger(__name__)


class HookFailed(AgentError):
    """A hook command failed (or could not start); mig-parted's exit status for it is 1."""


@dataclass(frozen=True, slots=True)
class Hook:
    command: str
    args: tuple[str, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()
    workdir: str = ""


@dataclass(frozen=True, slots=True)
class Hooks:
    by_name: Mapping[str, tuple[Hook, ...]]

    def run(self, name: str, env: Mapping[str, str], *, output: bool) -> None:
        """Run the hooks named ``name`` in order; HookFailed at the first that fails."""
        for hook in self.by_name.get(name, ()):
            log.debug("Running %s hook: %s %s", name, hook.command, " ".join(hook.args))
            try:
                done = subprocess.run(
                    [hook.command, *hook.args],
                    env={**dict(hook.envs), **env},
                    cwd=hook.workdir or None,
                    capture_output=not output,
                    text=True,
                    check=False,
                )
            except OSError as exc:
                raise HookFailed(f"error running {name} hook: {hook.command}: {exc}") from exc
            if done.returncode != 0:
                last = (done.stderr or done.stdout or "").strip().splitlines()
                said = f": {last[-1]}" if last else ""
                raise HookFailed(
                    f"error running {name} hook: {hook.command} exited {done.returncode}{said}"
                )


NO_HOOKS = Hooks({})


def load_hooks(path: str | Path) -> Hooks:
    """Parse a hooks file; InvalidSpec naming every bad field."""
    where = str(path)
    raw = safeyaml.read_text(Path(path), "hooks-file", _MAX_BYTES, what="hooks file")
    data = safeyaml.load(raw, "hooks-file")  # bounded; refusals name the field
    bad: list[FieldViolation] = []
    hooks = _parse(data, bad)
    if bad:
        raise InvalidSpec.of(where, bad)
    return hooks


def _parse(data: Any, bad: list[FieldViolation]) -> Hooks:
    if not isinstance(data, dict):
        bad.append(FieldViolation("", "a mapping with 'version' and 'hooks'"))
        return NO_HOOKS
    for key in sorted(set(data) - {"version", "hooks"}):
        bad.append(FieldViolation(str(key), "unknown key; allowed: version, hooks"))
    if data.get("version") != "v1":
        bad.append(FieldViolation("version", "must be 'v1'"))
    table = data.get("hooks") or {}
    if not isinstance(table, dict):
        bad.append(FieldViolation("hooks", "a mapping of hook name to a list of hooks"))
        return NO_HOOKS
    out: dict[str, tuple[Hook, ...]] = {}
    total = 0
    for name, items in table.items():
        field = f"hooks.{name}"
        if name not in HOOK_NAMES:
            bad.append(FieldViolation(field, f"unknown hook; allowed: {', '.join(HOOK_NAMES)}"))
            continue
        if not isinstance(items, list):
            bad.append(FieldViolation(field, "a list of hooks"))
            continue
        total += len(items)
        out[name] = tuple(
            h for i, item in enumerate(items) if (h := _hook(item, f"{field}[{i}]", bad))
        )
    if total > _MAX_HOOKS:
        bad.append(FieldViolation("hooks", f"at most {_MAX_HOOKS} hooks in all"))
    return Hooks(out)


def _hook(item: Any, field: str, bad: list[FieldViolation]) -> Hook | None:
    if not isinstance(item, dict):
        bad.append(FieldViolation(field, "a mapping with command, args, envs, workdir"))
        return None
    for key in sorted(set(item) - set(_HOOK_KEYS)):
        bad.append(
            FieldViolation(f"{field}.{key}", f"unknown key; allowed: {', '.join(_HOOK_KEYS)}")
        )
    command = item.get("command")
    if not isinstance(command, str) or not command:
        bad.append(FieldViolation(f"{field}.command", "required: the program to run"))
    args = item.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        bad.append(FieldViolation(f"{field}.args", "a list of strings"))
        args = []
    envs = item.get("envs") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
    ):
        bad.append(FieldViolation(f"{field}.envs", "a mapping of strings to strings"))
        envs = {}
    workdir = item.get("workdir") or ""
    if not isinstance(workdir, str):
        bad.append(FieldViolation(f"{field}.workdir", "a directory path"))
        workdir = ""
    if not isinstance(command, str) or not command:
        return None
    return Hook(command, tuple(args), tuple(sorted(envs.items())), workdir)


class MigConfigApplier(Protocol[R]):
    """mig-parted's ``MigConfigApplier``: the two phases of an apply, each asserted before it
    is applied, that `apply_with_hooks` runs its hooks between."""

    def mode_applied(self) -> bool:
        """Whether every GPU already has the MIG mode asked for."""
        ...

    def apply_mode(self) -> R:
        """Apply the MIG mode only."""
        ...

    def config_applied(self) -> bool:
        """Whether the whole config (mode and instances) is already there."""
        ...

    def apply_config(self) -> R:
        """Apply the whole config."""
        ...

    def stop_after_mode(self, result: R) -> bool:
        """Whether the mode phase's ``result`` ends the apply (a mode change left pending: no
        instances can be made until the reset or reboot)."""
        ...


def apply_with_hooks(
    hooks: Hooks,
    env: Mapping[str, str],
    applier: MigConfigApplier[R],
    *,
    output: bool,
    mode_only: bool,
) -> list[R]:
    """mig-parted's ``ApplyMigConfigWithHooks``: the phases that had to run, their results."""
    results: list[R] = []
    with _bracketed(hooks, env, output=output):
        if not applier.mode_applied():
            hooks.run("pre-apply-mode", env, output=output)
            results.append(applier.apply_mode())
            if applier.stop_after_mode(results[-1]):
                return results
        if mode_only:
            return results
        if not applier.config_applied():
            hooks.run("pre-apply-config", env, output=output)
            results.append(applier.apply_config())
    return results


@contextmanager
def _bracketed(hooks: Hooks, env: Mapping[str, str], *, output: bool) -> Iterator[None]:
    """apply-start before the phases, apply-exit after them, whether they fail or not."""
    hooks.run("apply-start", env, output=output)
    try:
        yield
    except BaseException:
        # apply-exit always runs; its own failure is the error only when nothing else failed.
        try:
            hooks.run("apply-exit", env, output=output)
        except HookFailed as exc:
            log.error("%s", exc)
        raise
    hooks.run("apply-exit", env, output=output)
