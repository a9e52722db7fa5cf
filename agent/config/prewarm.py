"""The prewarm section of the agent config (agent/config/schema.py): the local cache of container
images and model / dataset files, its egress policy and credentials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.config.rules import are_egress_entries, are_header_dirs, is_http_url, rules
from agent.prewarm.labels import DEFAULT_MAX
from agent.prewarm.naming import (
    DEFAULT_IGNORED_QUERY_PARAMS,
    MAX_IGNORED_QUERY_PARAMS,
    MAX_QUERY_PARAM_CHARS,
    check_ignored_query_params,
)
from agent.prewarm.private_images import DEFAULT_KUBELET_CONFIG, MODES, ONLY_IF_KUBELET_VERIFIES

_GIB = 1024**3


@dataclass(frozen=True)
class PrewarmSettings:
    """The local cache of container images and model / dataset files."""

    cache_dir: Path = field(
        default=Path("/var/cache/gpu-agent"),
        metadata=rules(doc="Directory of the content-addressed file cache; put it on local NVMe."),
    )
    budget_bytes: int = field(
        default=200 * _GIB,
        metadata=rules(
            gt=0,
            byte_size=True,
            doc="Bytes the file cache may hold (default 200Gi); least recently used items are "
            "evicted past it. Accepts suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti.",
        ),
    )
    max_volume_share: float = field(
        default=0.8,
        metadata=rules(
            gt=0,
            le=1,
            doc="Largest fraction of the cache volume the cache may fill, whatever the budget, so "
            "a shared disk keeps room for the node's other users.",
        ),
    )
    allow_http: bool = field(
        default=False,
        metadata=rules(
            doc="Allow plain http:// origins. Off because digests guard content, not privacy."
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=rules(
            doc="Origin hosts (names, globs, CIDRs) files and models may be fetched from; empty "
            "allows any host not denied. Non-public addresses stay denied until egress_allow "
            "opens them."
        ),
    )
    denied_hosts: tuple[str, ...] = field(
        default=(),
        metadata=rules(
            doc="Hosts (names, globs, CIDRs) never fetched from nor pulled from; wins over "
            "allowed_hosts and egress_allow."
        ),
    )
    egress_allow: tuple[str, ...] = field(
        default=(),
        metadata=rules(
            check=are_egress_entries,
            allowed="a list of CIDRs or addresses (127.0.0.0/8, ::1) and host names or globs "
            "(minio.internal, *.corp.example)",
            doc="Non-public addresses the agent may fetch from and pull images from. Without "
            "an entry, loopback, private (RFC 1918), CGNAT, link-local, unique-local (ULA), "
            "multicast and cloud metadata addresses are denied in every spelling (IPv4-mapped, "
            "NAT64, 6to4, decimal, octal and hex forms), checked on the address connected to after "
            "DNS and on every redirect. A CIDR opens the addresses it holds; a host name opens "
            "whatever that name resolves to.",
        ),
    )
    dragonfly_socket: Path | None = field(
        default=None,
        metadata=rules(
            doc="Dragonfly dfdaemon socket; when set, files are fetched through its P2P network "
            "(and Nydus image data blobs, when no dragonfly_proxy is set)."
        ),
    )
    dragonfly_output: str = field(
        default="stream",
        metadata=rules(
            choices=("stream", "hard-link"),
            doc="How files fetched through dragonfly_socket reach the cache. stream: dfdaemon "
            "sends every piece over gRPC and the agent writes it (a second copy beside "
            "dfdaemon's own). hard-link: dfdaemon hard-links its task file into the cache's "
            "partial directory (output_path with force_hard_link, no piece content sent); "
            "needs dfdaemon to see cache_dir at the same path, on the filesystem of its "
            "storage. The file is still checked (size, sha256) before it is ready; when "
            "dfdaemon refuses the link, the agent logs why and streams instead.",
        ),
    )
    dragonfly_proxy: str | None = field(
        default=None,
        metadata=rules(
            check=is_http_url,
            allowed="an http:// or https:// URL, e.g. http://127.0.0.1:65001",
            doc="dfdaemon's HTTP proxy URL, used for files when no dfdaemon socket is set, and "
            "for the data blobs of Nydus images (the path nydusd reads them through), so their "
            "data is in the node's Dragonfly cache before the pod starts.",
        ),
    )
    containerd_socket: Path = field(
        default=Path("/run/containerd/containerd.sock"),
        metadata=rules(
            doc="CRI socket images are pulled through, so the kubelet finds them in place."
        ),
    )
    docker_config: Path | None = field(
        default=None,
        metadata=rules(
            doc="A Docker config.json with registry credentials for image pulls; none means "
            "anonymous pulls.",
        ),
    )
    private_images: str = field(
        default=ONLY_IF_KUBELET_VERIFIES,
        metadata=rules(
            choices=MODES,
            doc="Images pulled with docker_config credentials (private images). The agent's "
            "pull is, to the kubelet, a preloaded image, which its default "
            "imagePullCredentialsVerificationPolicy (NeverVerifyPreloadedImages) lets every pod "
            "on the node run without credentials. only-if-kubelet-verifies: pulled only when "
            "kubelet_config says the kubelet re-verifies credentials for the image "
            "(AlwaysVerify, or NeverVerifyAllowlistedImages with the image off the allowlist), "
            "else refused with the reason; a config not read counts as not verifying. "
            "usable-by-every-pod: pulled anyway, the operator accepting that every pod on the "
            "node may run them.",
        ),
    )
    kubelet_config: Path = field(
        default=DEFAULT_KUBELET_CONFIG,
        metadata=rules(
            doc="The kubelet's config file (KubeletConfiguration), read for its "
            "imagePullCredentialsVerificationPolicy, preloadedImagesVerificationAllowlist and "
            "KubeletEnsureSecretPulledImages gate when a private image is prewarmed; mount it "
            "read-only into the agent's pod.",
        ),
    )
    kubelet_config_dir: Path | None = field(
        default=None,
        metadata=rules(
            doc="The kubelet's --config-dir, when it has one: its *.conf drop-ins are merged "
            "over kubelet_config in name order, as the kubelet does.",
        ),
    )
    insecure_registries: tuple[str, ...] = field(
        default=(),
        metadata=rules(
            doc="Registries (host or host:port, globs allowed) whose manifests and Nydus blobs "
            "are read over plain http, as containerd's hosts.toml server = http://… does; "
            "loopback registries (localhost, 127.0.0.1, ::1) always are. Host allow/deny lists "
            "still apply.",
        ),
    )
    nydus_system_socket: Path | None = field(
        default=None,
        metadata=rules(
            requires="nydus_prefetch_list",
            doc="nydus-snapshotter's system socket (e.g. /run/containerd-nydus/system.sock). When "
            "set and no Dragonfly is configured, prewarming a Nydus image also sends the "
            "snapshotter a prefetch hint (PUT /api/v1/prefetch), used once when that image's "
            "nydusd next starts; the image is still reported bootstrap-only.",
        ),
    )
    nydus_prefetch_list: Path | None = field(
        default=None,
        metadata=rules(
            requires="nydus_system_socket",
            doc="The prefetch hint's file, as nydusd sees it on the host: one absolute path per "
            "line of the files or directories to prefetch ('/' for the whole image).",
        ),
    )
    dragonfly_ca_file: Path | None = field(
        default=None,
        metadata=rules(
            doc="PEM CA bundle that signs the certificates dfdaemon's proxy presents for https "
            "URLs (its proxy.server.caCert); trusted in addition to the system CAs.",
        ),
    )
    audit_interval_s: float = field(
        default=60.0,
        metadata=rules(
            ge=1.0,
            doc="Seconds between audits that re-check every ready item (blob on disk with its "
            "size, image present in the CRI) and republish the node labels.",
        ),
    )
    max_node_labels: int = field(
        default=DEFAULT_MAX,
        metadata=rules(
            ge=0,
            le=1000,
            doc="Most ready items published as gpu-agent.io/cache.<name> node labels (pinned "
            "first, then by name); the rest are counted in gpu_agent_prewarm_node_labels"
            '{state="withheld"}. Every watcher of Nodes receives each label with every change '
            "of the Node; 0 publishes none.",
        ),
    )
    retry_initial_s: float = field(
        default=30.0,
        metadata=rules(
            gt=0,
            doc="Delay before the agent retries a file that failed for a transient reason "
            "(origin or network down after the fetcher's own retries); doubles each time.",
        ),
    )
    retry_max_s: float = field(
        default=3600.0,
        metadata=rules(gt=0, doc="Longest delay between the agent's retries of a failed file."),
    )
    ignored_query_params: tuple[str, ...] = field(
        default=DEFAULT_IGNORED_QUERY_PARAMS,
        metadata=rules(
            check=check_ignored_query_params,
            allowed=f"at most {MAX_IGNORED_QUERY_PARAMS} query keys or globs of one (X-Amz-*), "
            f"each 1-{MAX_QUERY_PARAM_CHARS} characters without & = # % or spaces",
            doc="Query parameters (names, or globs such as X-Amz-*, matched case-sensitively) "
            "left out of a file's source identity: the parameters that sign a URL, so a "
            "re-signed URL is the same item, a hit when ready, and resumes its partial from its "
            "verified bytes when not. The default is Dragonfly's default filtered query params "
            "(S3 v4, GCS, OSS, OBS, COS, containerd's ns) plus S3 v2's AWSAccessKeyId, the Azure "
            "SAS parameters and OSS v4's x-oss-* signature parameters; an empty list makes the "
            "whole URL the identity.",
        ),
    )
    header_dirs: tuple[str, ...] = field(
        default=(),
        metadata=rules(
            check=are_header_dirs,
            allowed="a list of ORIGIN=DIRECTORY, ORIGIN being scheme://host[:port], e.g. "
            "https://huggingface.co=/etc/gpu-agent/secrets/hf",
            doc="Directories request header files (tokens, mounted secrets) may be read from, "
            "each bound to the one origin (scheme, host, port) its headers may be sent to; list "
            "a directory once per origin. A header file outside them is refused, as is one "
            "whose directory is not bound to the request's origin, and a redirect to another "
            "origin drops the headers: an API caller cannot make the agent send a node file or "
            "a secret anywhere else.",
        ),
    )
