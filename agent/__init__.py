"""gpu-node-agent: the per-node GPU agent (MIG, sharing, prewarm, telemetry, gRPC control API)."""

__version__ = "0.1.0"
