"""What the fleet should look like: demand (files, pods, ResourceClaims), the exact MIG planner
and its solver, right-sizing, capacity replays and plan files. Pure: no gRPC, no clock.

May import ``agent.coordinator.fleet`` (the views it plans over); not rollout or control."""
