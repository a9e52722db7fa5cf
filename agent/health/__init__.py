"""Health marks: a state per GPU and MIG instance (healthy, degraded, failed) from what the
driver reports, with hysteresis, a hold-down before clearing and a cap on changes
(docs/health.md). ``machine`` and ``signals`` are pure; ``monitor`` runs them on the
telemetry snapshots; ``publish`` puts the marks on the Node."""
