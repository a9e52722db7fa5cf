"""Shared helpers of the deployment tests: repo paths, external tools, rendered manifests.

kubectl (Debian package kubernetes-client) and promtool (Debian package prometheus) are real
dependencies of these tests: a missing binary fails the test that needs it with the package to
install, never a silent skip.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE_ROOT = DEPLOY / "kubernetes"

#: Every kustomization a user may apply: the default install and each overlay.
KUSTOMIZATIONS: dict[str, Path] = {
    "default": KUSTOMIZE_ROOT,
    **{p.name: p for p in sorted((KUSTOMIZE_ROOT / "overlays").iterdir()) if p.is_dir()},
}

_PACKAGES = {"kubectl": "kubernetes-client", "promtool": "prometheus"}

Obj = dict[str, Any]


def tool(name: str) -> str:
    """The path of an external tool, or a test failure naming the Debian package to install."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not on PATH: install the Debian package {_PACKAGES[name]} "
            f"(apt-get install {_PACKAGES[name]}; scripts/test installs it)",
            pytrace=False,
        )
    return path


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, **kwargs)


@cache
def _render(path: Path) -> tuple[Obj, ...]:
    result = run([tool("kubectl"), "kustomize", str(path)])
    if result.returncode != 0:
        pytest.fail(
            f"kubectl kustomize {path.relative_to(REPO)} failed:\n{result.stderr}", pytrace=False
        )
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(name: str) -> list[Obj]:
    """The objects `kubectl kustomize` builds for one kustomization (cached per session)."""
    return list(_render(KUSTOMIZATIONS[name]))


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of ``kind`` (named ``name``); fails the test if there is not exactly one."""
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def containers(workload: Obj) -> Iterator[Obj]:
    yield from workload["spec"]["template"]["spec"]["containers"]


def agent_daemonset(objs: list[Obj]) -> Obj:
    return find(objs, "DaemonSet", "gpu-agent")


def agent_container(objs: list[Obj]) -> Obj:
    (container,) = [c for c in containers(agent_daemonset(objs)) if c["name"] == "agent"]
    return container


@pytest.fixture(params=sorted(KUSTOMIZATIONS))
def kustomization(request: pytest.FixtureRequest) -> str:
    """Each kustomization by name (the tests run once per overlay)."""
    return str(request.param)
