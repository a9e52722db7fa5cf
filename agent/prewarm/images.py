"""Image pulls through the node's CRI ImageService (containerd, namespace k8s.io).

Pulling through CRI rather than containerd's own API puts the image where the kubelet looks, so a
pod with imagePullPolicy IfNotPresent starts without pulling. A runtime handler (e.g. ``nydus``)
goes both in ImageSpec.runtime_handler and in the legacy sandbox annotation containerd 1.7 reads
to choose the handler's snapshotter (prewarm.md §3).

Pinning goes through containerd's own Images API on the same socket: the CRI has no call for
it. The ``io.cri-containerd.pinned=pinned`` label is set on every containerd name of the image
(its tags, digests and id, as ImageStatus lists them); containerd 1.7+ reports it as
``Image.pinned`` in the CRI, and the kubelet's image garbage collection skips pinned images.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import field_mask_pb2

from agent._proto.containerd.services.images.v1 import images_pb2, images_pb2_grpc
from agent._proto.k8s.cri.runtime.v1 import api_pb2 as cri
from agent._proto.k8s.cri.runtime.v1 import api_pb2_grpc as cri_grpc
from agent.errors import AgentError, NotFound
from agent.prewarm.docker_auth import credentials_for, registry_host
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.ports import PullResult
from agent.prewarm.private_images import DEFAULT_RULE, PrivateImageRule
from agent.redact import redact_text

RUNTIME_HANDLER_ANNOTATION = "io.containerd.cri.runtime-handler"
PINNED_LABEL = "io.cri-containerd.pinned"
_PINNED_VALUE = "pinned"
_NAMESPACE = (("containerd-namespace", "k8s.io"),)

__all__ = ["PINNED_LABEL", "RUNTIME_HANDLER_ANNOTATION", "CriPuller", "auth_for", "registry_host"]

#: the runtime itself down or restarting (containerd is restarted on node upgrades)
_RUNTIME_DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: a pull that may pass, as a file's fetch is retried: the registry unreachable (containerd
#: words Go's net errors) or answering 429 / 5xx
_PASSING = re.compile(
    r"connection refused|connection reset|i/o timeout|TLS handshake timeout|no such host"
    r"|unexpected EOF|toomanyrequests|unexpected status.{0,300}?: (?:429|5\d\d)\b",
    re.IGNORECASE,
)


def auth_for(ref: str, docker_config: Path | None) -> cri.AuthConfig | None:
    """Credentials for the image's registry from a Docker config.json ``auths`` entry."""
    creds = credentials_for(ref, docker_config)
    if creds is None:
        return None
    # No server_address: containerd url-parses it and compares the host with the one it dials,
    # so a bare "host:port" fails the pull ("first path segment in URL cannot contain colon",
    # seen against real containerd) and "docker.io" never equals registry-1.docker.io. The auth
    # travels with one image's pull, so it is for that image's registry anyway.
    return cri.AuthConfig(
        username=creds.username,
        password=creds.password,
        auth=creds.auth,
        identity_token=creds.identity_token,
        registry_token=creds.registry_token,
    )


class CriPuller:
    """PullImage over the CRI socket; times each pull and says whether it was cold."""

    def __init__(
        self,
        socket: Path,
        docker_config: Path | None = None,
        timeout_s: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
        private_images: PrivateImageRule = DEFAULT_RULE,
    ) -> None:
        self._target = f"unix://{socket}"
        self._socket = socket
        self._docker_config = docker_config
        self._private_images = private_images
        self._timeout = timeout_s
        self._clock = clock
        self._live: set[grpc.Future] = set()
        self._live_lock = threading.Lock()

    def check_private(self, ref: str) -> None:
        """PermissionDenied when ``ref`` would be pulled with the node's credentials and then
        be usable by every pod on the node (agent/prewarm/private_images.py)."""
        private = credentials_for(ref, self._docker_config) is not None
        self._private_images.check(ref, private)

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult:
        spec = cri.ImageSpec(image=ref, runtime_handler=runtime_handler or "")
        request = cri.PullImageRequest(image=spec)
        auth = auth_for(ref, self._docker_config)
        if auth is not None:
            # The last step before the runtime: refused here whatever path led to the pull.
            self._private_images.check(ref, uses_credentials=True)
            request.auth.CopyFrom(auth)
        if runtime_handler:
            request.sandbox_config.annotations[RUNTIME_HANDLER_ANNOTATION] = runtime_handler
        with grpc.insecure_channel(self._target) as channel:
            stub = cri_grpc.ImageServiceStub(channel)
            cold = not self._status(stub, spec, pulling=True).id
            start = self._clock()
            call = stub.PullImage.future(request, timeout=self._timeout)
            with self._live_lock:
                self._live.add(call)
            try:
                image_ref = call.result().image_ref
            except grpc.FutureCancelledError:
                raise Cancelled(f"pull of {ref} interrupted") from None
            except grpc.RpcError as exc:
                raise self._error(exc, ref, pulling=True) from None
            finally:
                with self._live_lock:
                    self._live.discard(call)
            seconds = self._clock() - start
            image = self._status(stub, cri.ImageSpec(image=image_ref or ref), pulling=True)
        return PullResult(image_ref or image.id, image.size or None, cold, seconds)

    def interrupt(self) -> None:
        """Cancel the pulls in flight (the agent is stopping); containerd keeps what it has
        and the item is pulled again, quickly, after the restart."""
        with self._live_lock:
            live = list(self._live)
        for call in live:
            call.cancel()

    def status(self, ref: str) -> cri.Image:
        """The image as CRI reports it; an empty ``id`` when absent."""
        with grpc.insecure_channel(self._target) as channel:
            return self._status(cri_grpc.ImageServiceStub(channel), cri.ImageSpec(image=ref))

    def present(self, ref: str) -> bool:
        """Whether the runtime has ``ref`` (ImageStatus); raises AgentError when it cannot say."""
        return bool(self.status(ref).id)

    def set_pinned(self, ref: str, pinned: bool) -> None:
        """Set or clear containerd's pinned label on every name of the image ``ref`` is."""
        image = self.status(ref)
        if not image.id:
            raise NotFound(f"image {ref} is not in the runtime; nothing to pin")
        names = [*image.repo_tags, *image.repo_digests, image.id]
        path = f"labels.{PINNED_LABEL}"
        with grpc.insecure_channel(self._target) as channel:
            stub = images_pb2_grpc.ImagesStub(channel)
            for name in dict.fromkeys(names):
                update = images_pb2.Image(name=name)
                if pinned:
                    update.labels[PINNED_LABEL] = _PINNED_VALUE
                request = images_pb2.UpdateImageRequest(
                    image=update, update_mask=field_mask_pb2.FieldMask(paths=[path])
                )
                try:
                    stub.Update(request, metadata=_NAMESPACE, timeout=30)
                except grpc.RpcError as exc:
                    if isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.NOT_FOUND:
                        continue  # a name removed since ImageStatus answered
                    raise self._error(exc, ref) from None

    def pinned_names(self, ref: str) -> list[str]:
        """The image's containerd names that carry the pinned label (for tests and status)."""
        image = self.status(ref)
        names = [*image.repo_tags, *image.repo_digests, image.id] if image.id else []
        out = []
        with grpc.insecure_channel(self._target) as channel:
            stub = images_pb2_grpc.ImagesStub(channel)
            for name in dict.fromkeys(names):
                try:
                    got = stub.Get(
                        images_pb2.GetImageRequest(name=name), metadata=_NAMESPACE, timeout=30
                    )
                except grpc.RpcError as exc:
                    raise self._error(exc, ref) from None
                if got.image.labels.get(PINNED_LABEL) == _PINNED_VALUE:
                    out.append(name)
        return out

    def remove(self, ref: str) -> None:
        with grpc.insecure_channel(self._target) as channel:
            try:
                cri_grpc.ImageServiceStub(channel).RemoveImage(
                    cri.RemoveImageRequest(image=cri.ImageSpec(image=ref)), timeout=60
                )
            except grpc.RpcError as exc:
                raise self._error(exc, ref) from None

    def _status(
        self, stub: cri_grpc.ImageServiceStub, spec: cri.ImageSpec, *, pulling: bool = False
    ) -> cri.Image:
        try:
            return stub.ImageStatus(cri.ImageStatusRequest(image=spec), timeout=30).image
        except grpc.RpcError as exc:
            raise self._error(exc, spec.image, pulling=pulling) from None

    def _error(self, exc: grpc.RpcError, ref: str, *, pulling: bool = False) -> AgentError:
        """The CRI's answer as an error. A pull's (``pulling``) is the item's failure: transient
        (retried by the agent with back-off) when the runtime or the registry may come back,
        final otherwise; a pin's or an eviction's is the caller's to see, not a fetch's."""
        code = exc.code() if isinstance(exc, grpc.Call) else None
        # containerd names the URLs it requested: a registry's redirect to a presigned object
        # store URL carries its signature in the query, which no row, reply or log keeps.
        details = redact_text((exc.details() if isinstance(exc, grpc.Call) else str(exc)) or "")
        if code in _RUNTIME_DOWN:
            if not self._socket.exists():  # gRPC's words for it are three lines of addresses
                details = "no socket there (containerd not running, or not mounted into the agent)"
            down = f"CRI runtime not reachable at {self._socket}: {details}"
            return FetchFailed(down, transient=True) if pulling else AgentError(down)
        if code is grpc.StatusCode.NOT_FOUND or "not found" in details:
            return NotFound(f"image {ref}: {details}")
        return FetchFailed(f"pull of {ref} failed: {details}", bool(_PASSING.search(details)))
