"""`coordinator serve`: the desired-state file, the reconcile loop and its back-off, the
leader Lease, what it tells the cluster (Events, status ConfigMap), its HTTP endpoints, and
its composition root (app).

The top room: may import every other room and ``agent.coordinator.flows``."""
