# syntax=docker/dockerfile:1
# gpu-node-agent: the per-node agent image (run by the DaemonSet in deploy/kubernetes).
#
#   docker build -f docker/agent.Dockerfile -t gpu-node-agent:0.1.0 .
#
# Build from the repository root: the context is the source tree, filtered by
# docker/agent.Dockerfile.dockerignore (BuildKit reads the ignore file next to the Dockerfile).

# Pinned by digest so a rebuild gets the same bytes; bump the tag and digest together
# (`docker buildx imagetools inspect python:3.11.13-slim-bookworm` prints the digest).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

# --- build: install the package into a virtual environment ---------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/gpu-agent/bin:$PATH
RUN python3 -m venv /opt/gpu-agent
WORKDIR /src
# Only what the wheel is built from: pyproject.toml names README.md as the readme, and the
# packages are agent* and dcgm* (the counters CSVs ship as package data).
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY dcgm ./dcgm
# The README's install command, run with the venv's python3 (first on PATH).
RUN python3 -m pip install .

# --- runtime ----------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-node-agent" \
      org.opencontainers.image.description="Per-node GPU agent: MIG layouts, GPU sharing, cache prewarm, DCGM-compatible telemetry" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpu-agent /opt/gpu-agent
# The NVIDIA container runtime reads NVIDIA_*: mount every GPU and the driver's management
# libraries (libnvidia-ml.so.1, and nvidia-smi for the MIG reset command). "utility" is all NVML
# needs; the agent runs no CUDA. The DaemonSet sets them too, so they are visible there.
ENV PATH=/opt/gpu-agent/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Root, on purpose: MIG mode changes, GPU-instance and compute-instance creation and the
# profiling counters need CAP_SYS_ADMIN, and the MIG capability device
# (/dev/nvidia-caps/nvidia-cap1) is root-only. The DaemonSet drops every other capability;
# docs/install.md lists each privilege and why.
USER 0:0
EXPOSE 9400 9401
ENTRYPOINT ["gpu-agent"]
CMD ["serve"]
