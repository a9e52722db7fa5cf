"""The container images, checked from their Dockerfiles (no Docker engine runs here).

Both images install the package with the README's install command, from a pinned base image,
start the `gpu-agent` console script, and copy exactly the files the wheel is built from; the
last point is proven by building the wheel from those files alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, find, render, run

DOCKER = REPO / "docker"
IMAGES = {"agent": DOCKER / "agent.Dockerfile", "coordinator": DOCKER / "coordinator.Dockerfile"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
_PIN = re.compile(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    out, buffer = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        word, _, rest = buffer.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        buffer = ""
    assert not buffer, f"{dockerfile.name} ends inside a continued line"
    return out


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (the preamble before the first FROM is stage 0's)."""
    result: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM" and result[-1] and any(i[0] == "FROM" for i in result[-1]):
            result.append([])
        result[-1].append(instruction)
    return result


def _args(dockerfile: Path) -> dict[str, str]:
    return dict(
        a.split("=", 1) for kind, a in instructions(dockerfile) if kind == "ARG" and "=" in a
    )


def _readme_install_command() -> str:
    """The install command of the README's install paragraph."""
    text = (REPO / "README.md").read_text()
    commands = re.findall(r"^\s*(python3 -m pip install [^\s#]+)", text, re.MULTILINE)
    if not commands:
        pytest.fail(
            "README.md shows no install command (`python3 -m pip install .`): the images must "
            "install the way the README says",
            pytrace=False,
        )
    assert len(set(commands)) == 1, f"README.md shows several install commands: {commands}"
    return commands[0]


@pytest.fixture(params=sorted(IMAGES))
def image(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_base_image_is_pinned_by_digest(image: str) -> None:
    dockerfile = IMAGES[image]
    args = _args(dockerfile)
    froms = [a.split()[0] for kind, a in instructions(dockerfile) if kind == "FROM"]
    assert len(froms) == 2, "a build stage and a runtime stage"
    for ref in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        assert _PIN.fullmatch(resolved), f"{ref} -> {resolved}: pin an exact tag by digest"


def test_installs_with_the_readme_command(image: str) -> None:
    """The build stage runs the README's install command, and nothing else installs the app."""
    command = _readme_install_command()
    runs = [a for kind, a in instructions(IMAGES[image]) if kind == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert installs == [command], f"expected `{command}`, found {installs}"


def test_runtime_stage_runs_the_console_script(image: str) -> None:
    """ENTRYPOINT is the `gpu-agent` console script of pyproject.toml, exec form (signals reach
    the agent), with the venv the build stage made on PATH."""
    assert PYPROJECT["project"]["scripts"]["gpu-agent"] == "agent.cli.main:main"
    runtime = stages(IMAGES[image])[-1]
    entry = [json.loads(a) for kind, a in runtime if kind == "ENTRYPOINT"]
    assert entry == [["gpu-agent"]]
    cmd = [json.loads(a) for kind, a in runtime if kind == "CMD"]
    assert cmd == [{"agent": ["serve"], "coordinator": ["coordinator", "serve"]}[image]]
    copies = [a for kind, a in runtime if kind == "COPY"]
    assert "--from=build /opt/gpu-agent /opt/gpu-agent" in copies
    env = " ".join(a for kind, a in runtime if kind == "ENV")
    assert "PATH=/opt/gpu-agent/bin:$PATH" in env


def test_image_users_match_the_manifests() -> None:
    """The coordinator image runs as the non-root uid its Deployment asserts; the agent as root,
    which its DaemonSet states too (docs/install.md says why)."""
    objs = render("default")
    users = {
        name: [a for kind, a in stages(path)[-1] if kind == "USER"] for name, path in IMAGES.items()
    }
    deployment = find(objs, "Deployment", "gpu-agent-coordinator")["spec"]["template"]["spec"]
    uid = deployment["securityContext"]["runAsUser"]
    assert users["coordinator"] == [f"{uid}:{uid}"] and uid != 0
    assert users["agent"] == ["0:0"]


def test_manifest_args_match_the_image_commands() -> None:
    objs = render("default")
    daemonset = find(objs, "DaemonSet", "gpu-agent")["spec"]["template"]["spec"]
    deployment = find(objs, "Deployment", "gpu-agent-coordinator")["spec"]["template"]["spec"]
    assert daemonset["containers"][0]["args"] == ["serve"]
    assert deployment["containers"][0]["args"] == ["coordinator", "serve"]


def _copied_sources(dockerfile: Path) -> list[str]:
    build = stages(dockerfile)[0]
    sources = []
    for kind, args in build:
        if kind == "COPY" and not args.startswith("--from"):
            *src, _dest = args.split()
            sources += src
    return sources


def test_build_context_holds_what_the_wheel_needs(image: str) -> None:
    """COPY brings pyproject.toml, the readme it names and every package it includes; the
    Dockerfile's ignore file lets exactly those into the context."""
    sources = _copied_sources(IMAGES[image])
    packages = [
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    assert set(sources) == {"pyproject.toml", PYPROJECT["project"]["readme"], *packages}
    text = (DOCKER / f"{IMAGES[image].name}.dockerignore").read_text()
    ignore = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    assert ignore[0] == "*", "ignore everything, then admit what is copied"
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert admitted == set(sources)


def _setuptools_builds_wheels() -> bool:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    return parts >= (70, 1)


def test_the_copied_files_build_the_wheel(tmp_path: Path) -> None:
    """Build the wheel from only the files the Dockerfile copies (as `pip install .` does in the
    image): it has the gpu-agent entry point and the counters CSV package data."""
    context = tmp_path / "src"
    context.mkdir()
    for source in _copied_sources(IMAGES["agent"]):
        src = REPO / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / source)
    out = tmp_path / "wheel"
    # Build in this environment when its setuptools can (>= 70.1 builds wheels by itself), else
    # let pip fetch pyproject.toml's build requirements, as `pip install .` in the image does.
    isolation = ["--no-build-isolation"] if _setuptools_builds_wheels() else []
    result = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
         "-w", str(out), str(context)]
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("gpu_node_agent-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "gpu-agent = agent.cli.main:main" in zf.read(entry_points).decode()
    assert "dcgm/default-counters.csv" in names
    assert "agent/cli/main.py" in names
