"""DRA: how this node's GPUs reach pods, and what the agent may change because of it.

Kubernetes' Dynamic Resource Allocation (``resource.k8s.io/v1``, GA since 1.34) replaces the
device plugin on nodes that run a DRA driver (NVIDIA's is ``gpu.nvidia.com``). The allocation
mode decides which of the agent's changes are safe: on a node whose driver creates MIG
instances itself the agent must not create or destroy any (docs/dra.md).
"""
