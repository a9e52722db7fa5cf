"""Suite-wide fixtures: a fake Kubernetes API server shared by sharing and MIG tests."""

pytest_plugins = ["tests.kube.fixtures"]
