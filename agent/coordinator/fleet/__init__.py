"""The fleet as the coordinator reads it: finding the agents (discovery), their channels, each
node's view (inventory, health marks, slice capacity), selecting nodes, and `fleet status`.

May import the layers below the coordinator and ``agent.coordinator.kube``; nothing of the
other rooms (planning, rollout and control build on this one)."""
