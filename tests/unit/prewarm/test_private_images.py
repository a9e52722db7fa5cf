"""The tenant rule for private images (agent/prewarm/private_images.py): an image pulled with the
node's credentials goes to the runtime only when the kubelet re-verifies credentials for it, or
the operator accepts that every pod on the node may run it. Real files, read as the agent reads
them; each kubelet policy value, the default, the gate, the allowlist and the unknown cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import PermissionDenied
from agent.prewarm.private_images import (
    ALWAYS_VERIFY,
    NEVER_VERIFY,
    NEVER_VERIFY_ALLOWLISTED,
    NEVER_VERIFY_PRELOADED,
    ONLY_IF_KUBELET_VERIFIES,
    USABLE_BY_EVERY_POD,
    PrivateImageRule,
    read_kubelet_policy,
    refusal,
    repository,
)

REF = "registry.example.com/team/model:v1"
HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def kubelet_config(tmp_path: Path, body: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + body)
    return path


@pytest.mark.parametrize(
    ("policy", "verified"),
    [
        (NEVER_VERIFY, False),
        (NEVER_VERIFY_PRELOADED, False),
        (NEVER_VERIFY_ALLOWLISTED, True),  # the image is not on its (empty) allowlist
        (ALWAYS_VERIFY, True),
    ],
)
def test_each_kubelet_policy_decides_whether_a_private_image_is_pulled(
    tmp_path: Path, policy: str, verified: bool
) -> None:
    path = kubelet_config(tmp_path, f"imagePullCredentialsVerificationPolicy: {policy}\n")
    kubelet = read_kubelet_policy(path)
    assert kubelet.policy == policy and not kubelet.defaulted
    assert kubelet.verifies(REF) is verified
    reason = refusal(REF, True, ONLY_IF_KUBELET_VERIFIES, kubelet)
    if verified:
        assert reason is None
    else:
        assert reason is not None
        assert f"imagePullCredentialsVerificationPolicy is {policy}" in reason
        assert "usable by every pod on this node" in reason
        assert "prewarm.private_images: usable-by-every-pod" in reason
    # Opted in, or a public image (no credentials): never refused, whatever the kubelet does.
    assert refusal(REF, True, USABLE_BY_EVERY_POD, kubelet) is None
    assert refusal(REF, False, ONLY_IF_KUBELET_VERIFIES, kubelet) is None


def test_an_unset_policy_is_the_kubelet_default_which_does_not_verify(tmp_path: Path) -> None:
    kubelet = read_kubelet_policy(kubelet_config(tmp_path, "maxPods: 110\n"))
    assert kubelet.policy == NEVER_VERIFY_PRELOADED and kubelet.defaulted
    reason = refusal(REF, True, ONLY_IF_KUBELET_VERIFIES, kubelet)
    assert reason is not None and "NeverVerifyPreloadedImages (not set: the default)" in reason
    assert "never verifies an image pulled outside the kubelet" in reason


def test_always_verify_with_the_feature_gate_off_does_not_verify(tmp_path: Path) -> None:
    body = (
        "imagePullCredentialsVerificationPolicy: AlwaysVerify\n"
        "featureGates:\n  KubeletEnsureSecretPulledImages: false\n"
    )
    kubelet = read_kubelet_policy(kubelet_config(tmp_path, body))
    assert not kubelet.verifies(REF)
    reason = refusal(REF, True, ONLY_IF_KUBELET_VERIFIES, kubelet)
    assert reason is not None and "feature gate KubeletEnsureSecretPulledImages is off" in reason


@pytest.mark.parametrize(
    ("entry", "ref", "exempt"),
    [
        ("registry.example.com/team/model", REF, True),
        ("registry.example.com/team/*", REF, True),
        ("registry.example.com/*", REF, True),
        ("registry.example.com/team/other", REF, False),
        ("registry.example.com/tea/*", REF, False),  # a whole path segment, not a prefix
        ("alpine", "docker.io/library/alpine:3.20", True),  # familiar names compare normalized
        ("docker.io/library/alpine", "alpine@sha256:" + "a" * 64, True),
    ],
)
def test_the_allowlist_exempts_the_images_it_names(
    tmp_path: Path, entry: str, ref: str, exempt: bool
) -> None:
    body = (
        "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\n"
        f"preloadedImagesVerificationAllowlist:\n  - {entry}\n"
    )
    kubelet = read_kubelet_policy(kubelet_config(tmp_path, body))
    assert kubelet.verifies(ref) is not exempt
    reason = refusal(ref, True, ONLY_IF_KUBELET_VERIFIES, kubelet)
    assert (reason is not None) is exempt
    if exempt:
        assert reason is not None and f"allowlist entry {entry!r}" in reason


def test_repository_writes_out_docker_defaults() -> None:
    assert repository("alpine") == "docker.io/library/alpine"
    assert repository("team/app:1") == "docker.io/team/app"
    assert repository("localhost:5000/a/b:2") == "localhost:5000/a/b"
    assert repository("index.docker.io/library/x@sha256:00") == "docker.io/library/x"


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (None, "does not exist"),
        ("kind: Pod\n", "is not a KubeletConfiguration"),
        ("[not, a, mapping]\n", "is not a KubeletConfiguration"),
        ("a: [b\n", "not valid YAML"),
        (HEAD + "imagePullCredentialsVerificationPolicy: Sometimes\n", "is not one of"),
        (HEAD + "preloadedImagesVerificationAllowlist: x\n", "not a list"),
        (HEAD + "featureGates: {KubeletEnsureSecretPulledImages: maybe}\n", "not true or false"),
        ("x: " + "y" * (300 * 1024) + "\n", "larger than"),
    ],
)
def test_a_kubelet_config_not_read_is_unknown_and_refuses(
    tmp_path: Path, write: str | None, said: str
) -> None:
    path = tmp_path / "config.yaml"
    if write is not None:
        path.write_text(write)
    kubelet = read_kubelet_policy(path)
    assert kubelet.policy is None
    assert said in kubelet.where
    assert kubelet.describe().startswith("unknown (")
    reason = refusal(REF, True, ONLY_IF_KUBELET_VERIFIES, kubelet)
    assert reason is not None and "imagePullCredentialsVerificationPolicy is not known" in reason
    assert refusal(REF, False, ONLY_IF_KUBELET_VERIFIES, kubelet) is None


def test_an_unreadable_kubelet_config_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.mkdir()  # read as root too: a directory where the file should be
    kubelet = read_kubelet_policy(path)
    assert kubelet.policy is None and "cannot read kubelet config" in kubelet.where


def test_drop_ins_override_the_config_in_name_order(tmp_path: Path) -> None:
    base = kubelet_config(tmp_path, "imagePullCredentialsVerificationPolicy: AlwaysVerify\n")
    drop_ins = tmp_path / "kubelet.conf.d"
    drop_ins.mkdir()
    kubelet_config(drop_ins, "imagePullCredentialsVerificationPolicy: NeverVerify\n", "10-a.conf")
    kubelet_config(drop_ins, "featureGates: {Other: true}\n", "20-b.conf")
    kubelet_config(drop_ins, "imagePullCredentialsVerificationPolicy: Sometimes\n", "30.ignored")
    kubelet = read_kubelet_policy(base, drop_ins)
    assert kubelet.policy == NEVER_VERIFY
    assert "2 drop-in(s)" in kubelet.describe()
    kubelet_config(drop_ins, "imagePullCredentialsVerificationPolicy: AlwaysVerify\n", "90-z.conf")
    assert read_kubelet_policy(base, drop_ins).verifies(REF)


def test_the_rule_raises_permission_denied_and_reads_nothing_for_public_images(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "absent.yaml"
    rule = PrivateImageRule(kubelet_config=missing)
    with pytest.raises(PermissionDenied, match="would be usable by every pod on this node"):
        rule.check(REF, uses_credentials=True)
    rule.check(REF, uses_credentials=False)
    PrivateImageRule(USABLE_BY_EVERY_POD, missing).check(REF, uses_credentials=True)
    verified = kubelet_config(tmp_path, "imagePullCredentialsVerificationPolicy: AlwaysVerify\n")
    PrivateImageRule(kubelet_config=verified).check(REF, uses_credentials=True)
    assert "AlwaysVerify (" in PrivateImageRule(kubelet_config=verified).kubelet().describe()
