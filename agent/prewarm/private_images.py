"""Tenant-safe image prewarm: whether a pull made with the node's registry credentials may go
to the runtime (docs/security.md, "Private images").

An image the agent pulls through the CRI is, to the kubelet, *preloaded*: pulled by something
other than itself, so it has no record of the credentials that pulled it. Under the kubelet's
default ``imagePullCredentialsVerificationPolicy: NeverVerifyPreloadedImages`` (KEP-2535, gate
``KubeletEnsureSecretPulledImages``, beta and on by default since 1.35) such an image is used by
any pod on the node without credentials. So an image pulled with credentials (a private one) is
pulled only when the operator accepts that (`USABLE_BY_EVERY_POD`) or the kubelet's config says
it re-verifies credentials for this image (`KubeletPolicy.verifies`). Not known is not verified.

`read_kubelet_policy` reads the kubelet's config file (and its drop-in directory), bounded, and
never raises; `KubeletPolicy.describe` says what it found, for status and doctor; `refusal` is
the rule, pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import safeyaml
from agent.errors import InvalidSpec, PermissionDenied
from agent.prewarm.docker_auth import DOCKER_HUB, registry_host

NEVER_VERIFY = "NeverVerify"
NEVER_VERIFY_PRELOADED = "NeverVerifyPreloadedImages"
NEVER_VERIFY_ALLOWLISTED = "NeverVerifyAllowlistedImages"
ALWAYS_VERIFY = "AlwaysVerify"
POLICIES = (NEVER_VERIFY, NEVER_VERIFY_PRELOADED, NEVER_VERIFY_ALLOWLISTED, ALWAYS_VERIFY)
GATE = "KubeletEnsureSecretPulledImages"
POLICY_FIELD = "imagePullCredentialsVerificationPolicy"
ALLOWLIST_FIELD = "preloadedImagesVerificationAllowlist"

ONLY_IF_KUBELET_VERIFIES = "only-if-kubelet-verifies"
USABLE_BY_EVERY_POD = "usable-by-every-pod"
MODES = (ONLY_IF_KUBELET_VERIFIES, USABLE_BY_EVERY_POD)
SETTING = "prewarm.private_images"
DEFAULT_KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")

# A kubelet config is a few KiB; a drop-in directory a handful of files.
_LIMITS = safeyaml.Limits(max_bytes=256 * 1024)
_MAX_DROP_INS = 64


@dataclass(frozen=True, slots=True)
class KubeletPolicy:
    """What the node's kubelet config says it does with images it did not pull itself.

    ``policy`` None: not known (``where`` says why). ``defaulted``: the field is not set, so
    the kubelet's default holds. ``gate_off``: the feature gate is set false, so the kubelet
    verifies nothing, whatever the policy says.
    """

    policy: str | None
    where: str
    allowlist: tuple[str, ...] = ()
    defaulted: bool = False
    gate_off: bool = False

    def allowlisted(self, ref: str) -> str | None:
        """The allowlist entry that exempts ``ref`` from verification, if any."""
        repo = repository(ref)
        for entry in self.allowlist:
            if entry.endswith("/*"):
                if repo.startswith(_wildcard_base(entry[:-2]) + "/"):
                    return entry
            elif repo == _entry_repository(entry):
                return entry
        return None

    def verifies(self, ref: str) -> bool:
        """Whether a pod must show credentials for ``ref`` when the agent pulled it."""
        if self.policy is None or self.gate_off:
            return False
        if self.policy == ALWAYS_VERIFY:
            return True
        return self.policy == NEVER_VERIFY_ALLOWLISTED and self.allowlisted(ref) is None

    def why_not(self, ref: str) -> str:
        """Why a pull of ``ref`` by the agent would not be verified (for a refusal)."""
        if self.policy is None:
            return f"the kubelet's {POLICY_FIELD} is not known ({self.where})"
        if self.gate_off:
            return f"the kubelet's feature gate {GATE} is off ({self.where})"
        said = f"the kubelet's {POLICY_FIELD} is {self.policy}"
        if self.defaulted:
            said += " (not set: the default)"
        if self.policy == NEVER_VERIFY_ALLOWLISTED:
            return f"{said} and {ref} matches its allowlist entry {self.allowlisted(ref)!r}"
        if self.policy == NEVER_VERIFY_PRELOADED:
            return f"{said}, which never verifies an image pulled outside the kubelet"
        return f"{said}, which verifies no image already on the node"

    def describe(self) -> str:
        """One line for status and doctor: the policy the agent found, and where."""
        if self.policy is None:
            return f"unknown ({self.where})"
        text = self.policy + (" (default)" if self.defaulted else "")
        if self.gate_off:
            text += f", gate {GATE} off"
        if self.policy == NEVER_VERIFY_ALLOWLISTED:
            text += f", allowlist {list(self.allowlist)}"
        return f"{text} ({self.where})"


def refusal(ref: str, uses_credentials: bool, mode: str, kubelet: KubeletPolicy) -> str | None:
    """Why pulling ``ref`` must be refused, or None. Pure: the rule in one place."""
    if not uses_credentials or mode == USABLE_BY_EVERY_POD or kubelet.verifies(ref):
        return None
    return (
        f"private image {ref} (pulled with the node's registry credentials) would be usable by "
        f"every pod on this node: {kubelet.why_not(ref)}; set the kubelet's {POLICY_FIELD} to "
        f"{ALWAYS_VERIFY}, or set {SETTING}: {USABLE_BY_EVERY_POD} to accept that"
    )


@dataclass(frozen=True, slots=True)
class PrivateImageRule:
    """The operator's choice (``mode``) and where the kubelet's config is read from."""

    mode: str = ONLY_IF_KUBELET_VERIFIES
    kubelet_config: Path = DEFAULT_KUBELET_CONFIG
    kubelet_config_dir: Path | None = None

    def kubelet(self) -> KubeletPolicy:
        return read_kubelet_policy(self.kubelet_config, self.kubelet_config_dir)

    def check(self, ref: str, uses_credentials: bool) -> None:
        """Raise PermissionDenied when ``ref`` may not be pulled; reads the kubelet config
        only for a private image under the default mode."""
        if not uses_credentials or self.mode == USABLE_BY_EVERY_POD:
            return
        reason = refusal(ref, uses_credentials, self.mode, self.kubelet())
        if reason is not None:
            raise PermissionDenied(reason)


#: The rule with nothing configured: private images only where the kubelet verifies them.
DEFAULT_RULE = PrivateImageRule()


def repository(ref: str) -> str:
    """``ref`` without tag or digest, with Docker's defaults written out
    (``alpine:3`` -> ``docker.io/library/alpine``), as the kubelet compares its allowlist."""
    name = ref.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    return _entry_repository(name)


def _entry_repository(name: str) -> str:
    first, sep, rest = name.partition("/")
    if sep and first == "index.docker.io":
        name = f"{DOCKER_HUB}/{rest}"
    if registry_host(name) != DOCKER_HUB:
        return name
    first, sep, rest = name.partition("/")
    path = rest if sep and first == DOCKER_HUB else name
    return f"{DOCKER_HUB}/{path if '/' in path else 'library/' + path}"


def _wildcard_base(base: str) -> str:
    """The part of a ``<base>/*`` allowlist entry before ``/*``, normalized: a lone host
    (``registry.example.com/*``) stays a host, a lone Docker Hub namespace gains docker.io."""
    if "/" not in base:
        hostlike = "." in base or ":" in base or base == "localhost"
        return base if hostlike else f"{DOCKER_HUB}/{base}"
    return _entry_repository(base)


def read_kubelet_policy(config: Path, drop_in_dir: Path | None = None) -> KubeletPolicy:
    """The policy the kubelet's config file (then its ``*.conf`` drop-ins, in name order, as
    the kubelet's ``--config-dir`` merges them) sets; unknown, never an error, when a file is
    missing, unreadable, too big or not a KubeletConfiguration."""
    try:
        merged = _document(config)
        where = str(config)
        if drop_in_dir is not None:
            files = sorted(p for p in drop_in_dir.iterdir() if p.name.endswith(".conf"))
            if len(files) > _MAX_DROP_INS:
                raise InvalidSpec(f"more than {_MAX_DROP_INS} drop-ins in {drop_in_dir}")
            for path in files:
                merged = _merge(merged, _document(path))
            where += f" + {len(files)} drop-in(s) in {drop_in_dir}"
    except OSError as exc:  # listing the drop-in directory (a file's read error is below)
        return KubeletPolicy(None, f"cannot read the kubelet config: {exc}")
    except InvalidSpec as exc:  # it names the file: unreadable, too big, not YAML, not the kind
        return KubeletPolicy(None, str(exc))
    return policy_from(merged, where)


def policy_from(doc: Mapping[str, Any], where: str) -> KubeletPolicy:
    """The policy a (merged) KubeletConfiguration document sets. Pure."""
    gates = doc.get("featureGates") or {}
    gate = gates.get(GATE) if isinstance(gates, Mapping) else None
    if gate is not None and not isinstance(gate, bool):
        return KubeletPolicy(None, f"{where}: featureGates.{GATE} is not true or false")
    value = doc.get(POLICY_FIELD)
    allowlist = doc.get(ALLOWLIST_FIELD) or []
    if not isinstance(allowlist, list) or not all(isinstance(e, str) for e in allowlist):
        return KubeletPolicy(None, f"{where}: {ALLOWLIST_FIELD} is not a list of image names")
    if value is None:
        policy, defaulted = NEVER_VERIFY_PRELOADED, True
    elif value in POLICIES:
        policy, defaulted = value, False
    else:  # the kubelet would not start with it: whatever runs is not this file
        return KubeletPolicy(
            None,
            f"{where}: {POLICY_FIELD} {safeyaml.brief(value)} is not one of {', '.join(POLICIES)}",
        )
    return KubeletPolicy(policy, where, tuple(allowlist), defaulted, gate_off=gate is False)


def _document(path: Path) -> dict[str, Any]:
    text = safeyaml.read_text(path, str(path), _LIMITS.max_bytes, what="kubelet config")
    doc = safeyaml.load(text, str(path), _LIMITS)
    if (
        not isinstance(doc, dict)
        or doc.get("kind", "KubeletConfiguration") != "KubeletConfiguration"
    ):
        raise InvalidSpec(f"{path} is not a KubeletConfiguration")
    return doc


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A drop-in over the config: its fields replace, its feature gates add to the others."""
    merged = {**base, **over}
    gates = base.get("featureGates"), over.get("featureGates")
    if isinstance(gates[0], Mapping) and isinstance(gates[1], Mapping):
        merged["featureGates"] = {**gates[0], **gates[1]}
    return merged
