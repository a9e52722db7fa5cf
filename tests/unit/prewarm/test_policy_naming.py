"""URL policy and item naming: pure rules, with a stub resolver instead of DNS."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import InvalidSpec, PermissionDenied
from agent.prewarm.naming import (
    LABEL_PREFIX,
    check_name,
    default_name,
    label_key,
    source_identity,
)
from agent.prewarm.policy import UrlPolicy, redact_url


def resolving_to(*addresses: str) -> UrlPolicy:
    return UrlPolicy(resolver=lambda host, port: list(addresses))


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "fe80::1",
        "fd00:ec2::254",
        "100.100.100.200",
        "::ffff:169.254.169.254",
        "0.0.0.0",
    ],
)
def test_hosts_resolving_to_metadata_or_link_local_are_denied(address: str) -> None:
    with pytest.raises(PermissionDenied, match="denied"):
        resolving_to(address).check("https://innocent.example.com/model")


def test_every_resolved_address_is_checked_not_only_the_first() -> None:
    with pytest.raises(PermissionDenied):
        resolving_to("203.0.113.7", "169.254.169.254").check("https://two.example.com/m")


def test_allowed_hosts_accept_globs_and_cidrs_and_deny_wins() -> None:
    policy = UrlPolicy(
        allowed_hosts=("*.models.example.com", "10.0.0.0/8"),
        denied_hosts=("bad.models.example.com",),
        egress_allow=("10.0.0.0/8",),  # a private address: opened by the operator
        resolver=lambda h, p: ["10.1.2.3"],
    )
    assert policy.check("https://a.models.example.com/x").addresses == ("10.1.2.3",)
    assert policy.check("https://any.internal/x").host == "any.internal"  # allowed by address
    with pytest.raises(PermissionDenied):
        policy.check("https://bad.models.example.com/x")


def test_allow_list_refuses_other_hosts() -> None:
    policy = UrlPolicy(allowed_hosts=("models.example.com",), resolver=lambda h, p: ["203.0.113.1"])
    with pytest.raises(PermissionDenied, match="allowed_hosts"):
        policy.check("https://elsewhere.example.com/x")


def test_denied_cidr_applies_to_resolved_addresses() -> None:
    policy = UrlPolicy(denied_hosts=("192.0.2.0/24",), resolver=lambda h, p: ["192.0.2.9"])
    with pytest.raises(PermissionDenied):
        policy.check("https://x.example.com/")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://x/", "//x/y", "http://x/"])
def test_only_https_by_default(url: str) -> None:
    with pytest.raises(InvalidSpec, match="scheme"):
        resolving_to("203.0.113.1").check(url)


def test_redacted_urls_keep_no_credentials() -> None:
    assert redact_url("https://u:p@h.example.com:8443/a/b?X-Amz-Signature=s") == (
        "https://h.example.com:8443/a/b?…"
    )


@pytest.mark.parametrize("name", ["..", "../x", "a/b", "-a", "a-", "", "x" * 64, "a\\b", "ä"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidSpec):
        check_name(name)


def test_default_names_come_from_the_url_and_are_safe() -> None:
    assert default_name("https://h/models/llama/model-00001.safetensors?sig=1") == (
        "model-00001.safetensors"
    )
    assert default_name("registry.example.com/serving/vllm:0.6") == "vllm-0.6"
    assert default_name("https://h/") == "item"


@given(st.text(alphabet=st.characters(codec="ascii"), min_size=1, max_size=200))
def test_label_keys_always_fit_kubernetes_limits(raw: str) -> None:
    """Whatever the URL, the derived name is safe and its label name part is ≤ 63 chars."""
    name = default_name(f"https://h/{raw}")
    key = label_key(name)
    assert key.startswith(LABEL_PREFIX)
    assert len(key.split("/", 1)[1]) <= 63


def test_long_names_get_distinct_hashed_label_keys() -> None:
    a, b = "m" * 60 + "-a1", "m" * 60 + "-b2"
    assert label_key(a) != label_key(b)
    assert len(label_key(a).split("/", 1)[1]) == 63


# Kubernetes' qualified-name rule for the part of a label key after the prefix
# (k8s.io/apimachinery validation.IsQualifiedName), at most 63 characters.
_K8S_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _valid_key(key: str) -> bool:
    prefix, _, name = key.partition("/")
    return prefix == "gpu-agent.io" and len(name) <= 63 and bool(_K8S_LABEL_NAME.fullmatch(name))


def test_underscore_and_dash_names_get_distinct_valid_label_keys() -> None:
    assert label_key("llama_8b") != label_key("llama-8b")
    assert label_key("llama_8b") == "gpu-agent.io/cache.llama_8b"
    assert _valid_key(label_key("llama_8b")) and _valid_key(label_key("llama-8b"))


@given(st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_every_item_name_has_a_valid_label_key(name: str) -> None:
    if ".." not in name:
        assert _valid_key(label_key(name))


def test_a_hashed_long_name_cannot_equal_a_literal_name() -> None:
    """A shortened key holds '..', which no item name may contain."""
    long = "m" * 63
    key = label_key(long)
    short = key.removeprefix(LABEL_PREFIX)
    assert ".." in short and _valid_key(key)
    with pytest.raises(InvalidSpec):
        check_name(short)


def test_signature_parameters_are_not_part_of_the_identity() -> None:
    a = source_identity("https://b.s3.example.com/m.bin?X-Amz-Signature=a&X-Amz-Date=1&v=3")
    b = source_identity("https://b.s3.example.com/m.bin?v=3&X-Amz-Signature=b")
    assert a == b == "https://b.s3.example.com/m.bin?v=3"
    assert source_identity("https://h/m?Signature=s&Expires=1") == "https://h/m"
    assert source_identity("https://h/m?sig=1", ["sig"]) == "https://h/m"
    assert source_identity("https://h/m?X-Goog-Signature=1", ["X-Goog-*"]) == "https://h/m"
    assert source_identity("https://h/m?v=1") != source_identity("https://h/m?v=2")
