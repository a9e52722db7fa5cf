"""The environment ``gpu-agent sim exec`` gives a program so that it runs on the simulated node.

Pure: it names the node (``GPU_AGENT_SIMULATE``, ``GPU_AGENT_STATE_DIR``, the agent's own settings)
and puts ``site/`` first on PYTHONPATH, whose ``sitecustomize`` installs the simulator as
``pynvml`` in each Python process before the program's code runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SITE_DIR", "exec_environment"]

SITE_DIR = Path(__file__).resolve().parent / "site"


def exec_environment(base: Mapping[str, str], preset: str, state_dir: Path) -> dict[str, str]:
    env = dict(base)
    env["GPU_AGENT_SIMULATE"] = preset
    env["GPU_AGENT_STATE_DIR"] = str(Path(state_dir).resolve())
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *rest])
    return env
