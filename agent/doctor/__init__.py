"""``gpu-agent doctor``: read-only checks of what each duty of the agent needs, each with its
evidence and the one fix (docs/troubleshooting.md is organised by them).

A part above the API (it reads the agent's services and the API's socket rule) and below the
composition roots, which build it (agent/node.py) and hand its run to the servicer."""

from agent.doctor.facts import Facts
from agent.doctor.service import CHECKS, Doctor, build_doctor

__all__ = ["CHECKS", "Doctor", "Facts", "build_doctor"]
