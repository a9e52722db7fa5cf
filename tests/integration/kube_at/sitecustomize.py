"""The Kubernetes API server of the agent process a test starts with this directory on
PYTHONPATH: the kubeconfig ``KUBECONFIG`` names.

Why a stand-in: ``gpu-agent serve`` reads only a pod's service account (a fixed path under
/var/run/secrets), which a test cannot write; a laptop's kubeconfig is deliberately not used.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.kube import InClusterKubeClient


def _from_kubeconfig(cls: type[InClusterKubeClient]) -> InClusterKubeClient:
    return cls.from_kubeconfig(Path(os.environ["KUBECONFIG"]))


InClusterKubeClient.in_pod = classmethod(_from_kubeconfig)  # type: ignore[method-assign,assignment]
