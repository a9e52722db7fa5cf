"""``gpu-agent fleet …``: see the fleet, plan MIG layouts for it, roll changes across it.

Thin: parse, call `agent.coordinator.flows`, render. Every command talks to the agents through
their gRPC API (mTLS), found by a static list, a DNS name or the Kubernetes API.

One module per command (status, doctor, plan/replay/rightsize, apply, prewarm, resume, remediate),
their shared rollout options in ``rollout``; this module is only the group.
"""

from __future__ import annotations

import click

from agent.cli.errors import AgentGroup


@click.group(cls=AgentGroup)
def fleet() -> None:
    """See and change many nodes at once, through their agents' gRPC API (mTLS).

    \b
    Examples:
      gpu-agent fleet status --kubernetes
      gpu-agent fleet apply mig -f mig.yaml -c all-1g.10gb --selector model=*H100* \\
        --agents n1:9401,n2:9401 --max-unavailable 25% --record rollout.json
      gpu-agent fleet plan --demand demand.yaml --out plan.yaml --kubernetes
    """


def _add_commands() -> None:
    from agent.cli.fleet.apply import apply
    from agent.cli.fleet.doctor import doctor
    from agent.cli.fleet.plan import plan, replay_cmd, rightsize
    from agent.cli.fleet.prewarm import prewarm
    from agent.cli.fleet.remediate import remediate
    from agent.cli.fleet.resume import resume
    from agent.cli.fleet.status import status

    commands = (status, doctor, plan, replay_cmd, rightsize, apply, prewarm, resume, remediate)
    for command in commands:
        fleet.add_command(command)


_add_commands()
