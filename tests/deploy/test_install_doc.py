"""What docs/install.md and docs/troubleshooting.md tell an operator to run matches the
manifests: the commands that install what the agent needs beside it."""

from __future__ import annotations

import re

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
