"""Installs the simulated NVML driver as ``pynvml`` in every Python process started by
``gpu-agent sim exec`` (this directory leads PYTHONPATH there; Python imports ``sitecustomize``
at start-up). The node is the one ``GPU_AGENT_SIMULATE`` / ``GPU_AGENT_STATE_DIR`` name, as for
the agent itself. A ``sitecustomize`` this one shadows (a distribution's) still runs after it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path


def _install() -> None:
    preset = os.environ.get("GPU_AGENT_SIMULATE")
    state_dir = os.environ.get("GPU_AGENT_STATE_DIR")
    if not preset or not state_dir:
        return
    from agent.gpu.sim import install_as_pynvml

    install_as_pynvml(Path(state_dir), preset)


def _chain() -> None:
    here = str(Path(__file__).resolve().parent)
    rest = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
