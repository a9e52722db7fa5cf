"""Prewarm: model/dataset files and container images warmed on the node (docs/prewarm.md)."""
