"""Suite-wide fixtures: a fake Kubernetes API server shared by sharing and MIG tests.

Every agent the suite starts (in-process, embedded in a CLI command, or a ``serve`` process,
which inherits the environment) runs the simulated driver at memory speed: the modelled NVML
latencies (a second per MIG mode change) are for benchmarks and ``serve`` on a newcomer's
machine. A test about timing sets ``GPU_AGENT_SIMULATE_LATENCY=true`` itself.
"""

import os

os.environ.setdefault("GPU_AGENT_SIMULATE_LATENCY", "false")

pytest_plugins = ["tests.kube.fixtures"]
