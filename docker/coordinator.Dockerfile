# syntax=docker/dockerfile:1
# gpu-node-agent coordinator: the thin fleet controller (a Deployment in deploy/kubernetes).
#
#   docker build -f docker/coordinator.Dockerfile -t gpu-node-agent-coordinator:0.1.0 .
#
# Same package and install as the agent image; it only talks to the Kubernetes API and to the
# agents' gRPC API, so it runs as an unprivileged user and needs no NVIDIA runtime.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/gpu-agent/bin:$PATH
RUN python3 -m venv /opt/gpu-agent
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY dcgm ./dcgm
RUN python3 -m pip install .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-node-agent-coordinator" \
      org.opencontainers.image.description="Fleet coordinator for gpu-node-agent" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpu-agent /opt/gpu-agent
ENV PATH=/opt/gpu-agent/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user (the distroless "nonroot" id), so runAsNonRoot can verify it.
USER 65532:65532
ENTRYPOINT ["gpu-agent"]
CMD ["coordinator", "serve"]
