"""The thin central coordinator: fleet discovery and view, rollouts, prewarm fan-out, and the
fleet MIG planner. A client of the agents' gRPC API only; it keeps no state the agents,
Kubernetes or the user's files do not already hold (docs/coordinator.md)."""
