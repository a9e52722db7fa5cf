"""Changing nodes: the rollout scheduler, the per-node actions (MIG, sharing, prewarm, power)
through the agent API, the rollout record, drains, health gates and `fleet remediate`.

May import ``agent.coordinator.fleet`` and ``agent.coordinator.planning``; not control."""
