"""What the tests of two `coordinator serve` replicas share: three simulated H100 nodes, the
desired file that lays MIG out on GPU 0, a replica as a real process, the fleet's layouts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.unit.api.support import REPO, Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet

NODES = ("n1", "n2", "n3")
#: A coordinator's start-up (interpreter, imports, the fleet's first read) on a loaded machine.
START_S = 120.0


def desired(layout: str, devices: str) -> str:
    return f"""\
version: v1
rollout: {{max_unavailable: 1, max_failures: 3}}
mig:
  - selector: model=*H100*
    config_name: {layout}
    config: |
      version: v1
      mig-configs:
        {layout}:
          - devices: [0]
            mig-enabled: true
            mig-devices: {{{devices}}}
"""


@contextmanager
def h100_fleet(root: Path) -> Iterator[AgentFleet]:
    with AgentFleet(root, Pki(root / "pki"), dict.fromkeys(NODES, "dgx-h100")) as fleet:
        yield fleet


class Replica:
    """``coordinator serve`` of ``desired`` as a real process, once it serves its endpoints."""

    def __init__(
        self,
        name: str,
        agents: AgentFleet,
        desired: Path,
        env: Mapping[str, str],
        *flags: str,
    ) -> None:
        self.name = name
        self.base = ""  # its endpoints' URL, once `serving` saw it
        self.log = agents.root / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-c",
                    "from agent.cli.coordinator import coordinator; coordinator()",
                    "serve", "--desired", str(desired), "--interval", "1",
                    "--listen", "127.0.0.1:0", *flags, *agents.args(),
                ],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**env, "POD_NAME": name},
            )  # fmt: skip

    def serving(self) -> str:
        """Wait until it says where it serves; its base URL."""
        match = wait_for(
            lambda: re.search(r"/fleet/status on 127\.0\.0\.1:(\d+)", self.log.read_text()),
            f"{self.name} to serve",
            START_S,
        )
        self.base = f"http://127.0.0.1:{match.group(1)}"
        return self.base

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def layouts(agents: AgentFleet) -> dict[str, object]:
    out = agents.fleet("status", "--nodes", "-o", "json")
    return {n["name"]: n["gpus"][0]["devices"] for n in json.loads(out.output)["nodes"]}
