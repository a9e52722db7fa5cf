"""Image pulls through the node's CRI ImageService (containerd, namespace k8s.io).

Pulling through CRI rather than containerd's own API puts the image where the kubelet looks, so a
pod with imagePullPolicy IfNotPresent starts without pulling. A runtime handler (e.g. ``nydus``)
goes both in ImageSpec.runtime_handler and in the legacy sandbox annotation containerd 1.7 reads
to choose the handler's snapshotter (prewarm.md §3).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from agent._proto.k8s.cri.runtime.v1 import api_pb2 as cri
from agent._proto.k8s.cri.runtime.v1 import api_pb2_grpc as cri_grpc
from agent.errors import AgentError, InvalidSpec, NotFound
from agent.prewarm.errors import FetchFailed
from agent.prewarm.service import PullResult

RUNTIME_HANDLER_ANNOTATION = "io.containerd.cri.runtime-handler"
_DOCKER_HUB = "docker.io"
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")


def registry_host(ref: str) -> str:
    """The registry of an image reference, with Docker's defaulting rules."""
    first, sep, _ = ref.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost"):
        return _DOCKER_HUB
    return first


def auth_for(ref: str, docker_config: Path | None) -> cri.AuthConfig | None:
    """Credentials for the image's registry from a Docker config.json ``auths`` entry.

    Credential helpers (credsStore/credHelpers) are not run: the agent does not execute binaries
    named by a config file.
    """
    if docker_config is None:
        return None
    try:
        auths = json.loads(docker_config.read_text()).get("auths", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidSpec(f"cannot read docker config {docker_config}: {exc}") from None
    host = registry_host(ref)
    keys = _DOCKER_HUB_KEYS if host == _DOCKER_HUB else (host,)
    for key, entry in auths.items():
        bare = key.removeprefix("https://").removeprefix("http://").split("/", 1)[0]
        if (key in keys or bare in keys) and isinstance(entry, dict):
            auth = cri.AuthConfig(
                username=entry.get("username", ""),
                password=entry.get("password", ""),
                auth=entry.get("auth", ""),
                server_address=host,
                identity_token=entry.get("identitytoken", ""),
                registry_token=entry.get("registrytoken", ""),
            )
            if auth.auth and not auth.username:
                user, _, password = base64.b64decode(auth.auth).decode().partition(":")
                auth.username, auth.password = user, password
            return auth
    return None


class CriPuller:
    """PullImage over the CRI socket; times each pull and says whether it was cold."""

    def __init__(
        self,
        socket: Path,
        docker_config: Path | None = None,
        timeout_s: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = f"unix://{socket}"
        self._socket = socket
        self._docker_config = docker_config
        self._timeout = timeout_s
        self._clock = clock

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult:
        spec = cri.ImageSpec(image=ref, runtime_handler=runtime_handler or "")
        request = cri.PullImageRequest(image=spec)
        auth = auth_for(ref, self._docker_config)
        if auth is not None:
            request.auth.CopyFrom(auth)
        if runtime_handler:
            request.sandbox_config.annotations[RUNTIME_HANDLER_ANNOTATION] = runtime_handler
        with grpc.insecure_channel(self._target) as channel:
            stub = cri_grpc.ImageServiceStub(channel)
            cold = not self._status(stub, spec).id
            start = self._clock()
            try:
                image_ref = stub.PullImage(request, timeout=self._timeout).image_ref
            except grpc.RpcError as exc:
                raise self._error(exc, ref) from None
            seconds = self._clock() - start
            image = self._status(stub, cri.ImageSpec(image=image_ref or ref))
        return PullResult(image_ref or image.id, image.size or None, cold, seconds)

    def status(self, ref: str) -> cri.Image:
        """The image as CRI reports it; an empty ``id`` when absent."""
        with grpc.insecure_channel(self._target) as channel:
            return self._status(cri_grpc.ImageServiceStub(channel), cri.ImageSpec(image=ref))

    def remove(self, ref: str) -> None:
        with grpc.insecure_channel(self._target) as channel:
            try:
                cri_grpc.ImageServiceStub(channel).RemoveImage(
                    cri.RemoveImageRequest(image=cri.ImageSpec(image=ref)), timeout=60
                )
            except grpc.RpcError as exc:
                raise self._error(exc, ref) from None

    def _status(self, stub: cri_grpc.ImageServiceStub, spec: cri.ImageSpec) -> cri.Image:
        try:
            return stub.ImageStatus(cri.ImageStatusRequest(image=spec), timeout=30).image
        except grpc.RpcError as exc:
            raise self._error(exc, spec.image) from None

    def _error(self, exc: grpc.RpcError, ref: str) -> AgentError:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code is grpc.StatusCode.UNAVAILABLE:
            return AgentError(f"CRI runtime not reachable at {self._socket}: {details}")
        if code is grpc.StatusCode.NOT_FOUND or "not found" in (details or ""):
            return NotFound(f"image {ref}: {details}")
        return FetchFailed(f"pull of {ref} failed: {details}")
