"""What docs/install.md and docs/troubleshooting.md tell an operator to run matches the
manifests: the commands that install what the agent needs beside it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.errors import Conflict
from agent.health.device_taints import NODE_LABEL
from agent.health.publish import CONDITION, COUNT_LABELS, TAINT_KEY, TAINT_VALUE
from agent.health.publish import LABEL as HEALTH_LABEL
from agent.mig.labels import OPERAND_LABELS, PAUSED, STATE_LABEL
from agent.prewarm.naming import LABEL_PREFIX as CACHE_LABEL_PREFIX
from agent.reclaim import ANNOTATION as RECLAIM_ANNOTATION
from agent.sharing.dra import AGENT, MANAGED_BY
from agent.state import MIGRATIONS, StateStore
from tests.deploy.conftest import REPO, agent_daemonset, find, render

INSTALL = REPO / "docs" / "install.md"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
_SH = re.compile(r"```sh\n(.*?)```", re.S)


def _commands(text: str) -> list[str]:
    """Each shell command of the doc's ```sh blocks, continuation lines joined."""
    commands = []
    for block in _SH.findall(text):
        commands += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    return commands


def test_the_csi_driver_is_installed_to_run_wherever_the_agent_runs() -> None:
    """The agent's tls volume comes from cert-manager's CSI driver on its node; the chart
    tolerates no taint and sets no priority by default, so on tainted GPU nodes the driver
    would be absent and the agent stuck in ContainerCreating."""
    (install,) = [
        c for c in _commands(INSTALL.read_text()) if "jetstack/cert-manager-csi-driver" in c
    ]
    assert re.search(r"--set '?tolerations\[0\]\.operator=Exists'?(\s|$)", install), install
    assert "tolerations[0].key" not in install, "operator Exists without a key: every taint"
    pod = agent_daemonset(render("default"))["spec"]["template"]["spec"]
    assert f"--set priorityClassName={pod['priorityClassName']}" in install
    text = TROUBLESHOOTING.read_text()
    entry = text[text.index("**Stuck in ContainerCreating") :]
    entry = entry[: entry.index("\n\n")]
    assert "csi.cert-manager.io" in entry and "tolerations[0].operator=Exists" in entry


def test_the_rbac_table_lists_every_cluster_wide_grant_of_the_agent() -> None:
    """docs/install.md's "Kubernetes API access" rows for the agent name exactly what its
    ClusterRole grants, resource by resource, with the verbs."""
    rows = [
        line.split("|")[2].split()[:2]
        for line in INSTALL.read_text().splitlines()
        if line.startswith("| agent | ")
    ]
    documented = {resource: set(verbs.split("/")) for verbs, resource in rows}
    role = find(render("default"), "ClusterRole", "gpu-agent")
    granted = {res: set(rule["verbs"]) for rule in role["rules"] for res in rule["resources"]}
    assert documented == granted


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _left_behind_node() -> dict[str, Any]:
    """A node as a stopped agent leaves it: each key the agent writes, by its own constant."""
    labels = {
        "kubernetes.io/hostname": "gpu-1",
        "gpu-agent.io/pool": "inference",  # the user's own label
        f"{CACHE_LABEL_PREFIX}llama-8b": "ready",
        HEALTH_LABEL: "failed",
        **{label: "1" for label in COUNT_LABELS.values()},
        OPERAND_LABELS[0]: PAUSED,
        OPERAND_LABELS[1]: "false",  # the user's: stays off
        OPERAND_LABELS[2]: "true",
    }
    return {
        "metadata": {
            "name": "gpu-1",
            "labels": labels,
            "annotations": {RECLAIM_ANNOTATION: "0,1", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "taints": [
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"},
            ]
        },
        "status": {"conditions": [{"type": "Ready"}, {"type": CONDITION, "status": "False"}]},
    }


def test_the_uninstall_commands_remove_what_the_agent_leaves_and_nothing_else() -> None:
    """docs/install.md, "Uninstalling": its cleanup program, run on a node holding every key the
    agent writes (named by the agent's constants), removes each of them, restores the operand
    it paused, and leaves the user's labels, taints and conditions alone; the DRA objects are
    deleted by the label the agent puts on them."""
    section = _section(INSTALL.read_text(), "Uninstalling")
    (program,) = re.findall(r"python3 -c '\n(.*?)\n' >", section, re.S)
    items = {"items": [_left_behind_node()]}
    done = subprocess.run(
        [sys.executable, "-c", program],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        check=True,
    )
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    removed = {
        arg[:-1]
        for c in commands
        if c[1] in ("label", "annotate", "taint") and "--overwrite" not in c
        for arg in c[4:]
    }
    assert all(c[2:4] == ["node", "gpu-1"] for c in commands if "--overwrite" not in c)
    ours = {f"{CACHE_LABEL_PREFIX}llama-8b", HEALTH_LABEL, *COUNT_LABELS.values()}
    assert removed == ours | {RECLAIM_ANNOTATION, TAINT_KEY}
    assert ["kubectl", "label", "node", "--overwrite", "gpu-1", f"{OPERAND_LABELS[0]}=true"] in (
        commands
    )
    (patch,) = [c for c in commands if c[1] == "patch"]
    assert patch[:4] == ["kubectl", "patch", "node", "gpu-1"] and "--subresource=status" in patch
    assert json.loads(patch[-1]) == {
        "status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}
    }
    assert f"kubectl delete deviceclasses -l {MANAGED_BY}={AGENT}" in section
    assert f"kubectl delete devicetaintrules -l {NODE_LABEL}\n" in section
    assert "nvidia.com/device-plugin.config-" in section and f"{STATE_LABEL}-" in section


def test_the_rollback_advice_quotes_what_an_older_agent_says(tmp_path: Path) -> None:
    """docs/install.md, "Upgrading": the line an older agent dies with on a newer database is
    the one the doc tells the operator to look for."""

    class Newer(StateStore):
        MIGRATIONS = (*MIGRATIONS, (len(MIGRATIONS) + 1, "CREATE TABLE later (x TEXT)"))

    path = tmp_path / "agent.db"
    Newer(path).close()
    with pytest.raises(Conflict) as refused:
        StateStore(path)
    said = str(refused.value).replace(str(path), "/var/lib/gpu-agent/agent.db")
    said = re.sub(r"version \d+", "version N", said).replace(
        f"agent's {len(MIGRATIONS)}", "agent's M"
    )
    upgrading = " ".join(_section(INSTALL.read_text(), "Upgrading").split())
    assert f"`{said}`" in upgrading
    assert "agent.db agent.db-wal agent.db-shm" in upgrading
