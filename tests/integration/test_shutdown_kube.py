"""SIGTERM does not wait on a Kubernetes API server that never answers.

A real agent process on a simulated node, its API server (`tests/integration/kube_at`: the
kubeconfig it names) a loopback listener that accepts, reads and never answers. The agent's
calls to it (the Node's and the ResourceSlices' lists, discovery, the doctor's checks, the
health marks) each wait the client's 10 s timeout; the shutdown waited on them: 17.0 s of its
20 s budget, https and http alike. The stop now shuts their sockets: 0.2 to 0.3 s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.integration.shutdown_fixtures import assert_quick_clean_exit, silent_peer
from tests.kube.fixtures import NODE
from tests.unit.api.support import REPO, AgentProcess, agent_config

pytestmark = pytest.mark.integration

KUBE_AT = Path(__file__).parent / "kube_at"


def kubeconfig(path: Path, server: str) -> Path:
    """``insecure-skip-tls-verify``: an https server here never gets past the handshake."""
    cluster = {"server": server, "insecure-skip-tls-verify": server.startswith("https")}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "hung",
        "contexts": [{"name": "hung", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_sigterm_while_the_api_server_never_answers_exits_0_at_once(
    tmp_path: Path, scheme: str
) -> None:
    """The calls in flight wait in a TLS handshake (https) or for the answer (http). The bound
    is the shutdown's promise (SHUTDOWN_S, 2 s: docs/operations.md), from the signal to the
    process's exit: 7 to 10 times the 0.2 to 0.3 s measured on this project's 2-core VM, the
    margin a loaded machine needs, and far under the 17 s a wait on one call takes."""
    with silent_peer() as api:
        agent = AgentProcess(tmp_path, agent_config(tmp_path, node_name=NODE))
        path = os.pathsep.join(
            p for p in (str(KUBE_AT), str(REPO), os.environ.get("PYTHONPATH")) if p
        )
        config = kubeconfig(tmp_path / "kubeconfig", f"{scheme}://127.0.0.1:{api.port}")
        agent.env = {"PYTHONPATH": path, "KUBECONFIG": str(config)}
        try:
            agent.start()
            assert api.asked.wait(30), "the agent never called the API server"
            assert_quick_clean_exit(agent)
        finally:
            agent.stop()
