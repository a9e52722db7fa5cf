"""What every CLI command gets on ``ctx.obj``: the resolved config and lazily opened services."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.cli.client import AgentClient, RemoteSharing
    from agent.config import AgentConfig
    from agent.gpu import GpuDriver
    from agent.sharing.service import SharingService
    from agent.state import StateStore


@dataclass
class CliContext:
    """Resolved lazily so ``--help`` and bad-config errors never touch NVML or the disk."""

    config_file: Path | None
    flags: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    _config: AgentConfig | None = None
    _gpu: GpuDriver | None = None
    _state: StateStore | None = None
    _agent: AgentClient | None = None
    _agent_checked: bool = False
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def config(self) -> AgentConfig:
        if self._config is None:
            from agent.config import load_config

            self._config = load_config(self.config_file, self.env, self.flags)
        return self._config

    def gpu(self) -> GpuDriver:
        """The GPU facade in direct mode (real NVML, or the simulated node of --simulate)."""
        if self._gpu is None:
            from agent.gpu import open_driver

            cfg = self.config
            self._gpu = open_driver(cfg.simulate, cfg.state_dir)
            self._closers.append(self._gpu.close)
        return self._gpu

    def state(self) -> StateStore:
        if self._state is None:
            from agent.state import StateStore

            self._state = StateStore(self.config.state_dir / "agent.db")
            self._closers.append(self._state.close)
        return self._state

    def agent(self) -> AgentClient | None:
        """The running agent on ``socket_path``, or None: then the command works directly.

        Resolved once per command. PermissionDenied when an agent runs but this user may not
        use its socket (root only): never act beside a running agent.
        """
        if not self._agent_checked:
            from agent.cli.client import AgentClient

            self._agent_checked = True
            self._agent = AgentClient.connect(self.config.socket_path)
            if self._agent is not None:
                self._closers.append(self._agent.close)
        return self._agent

    def sharing_service(self) -> SharingService | RemoteSharing:
        """Through the running agent when there is one, else on the plugin's file directly."""
        client = self.agent()
        if client is not None:
            return client.sharing()
        from agent.sharing.service import SharingService

        def layouts() -> list[Any]:
            gpu = self.gpu()
            return [gpu.layout(g.uuid) for g in gpu.gpus()]

        from agent.kube import InClusterKubeClient

        # In a pod (kubectl exec into the agent) the label and restart-pod reloads work too.
        kube = InClusterKubeClient.in_pod()
        return SharingService(self.config.sharing, layouts, kube, node_name=self.config.node_name)

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()
