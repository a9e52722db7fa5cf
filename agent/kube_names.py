"""Kubernetes' name rules (apimachinery's validation), so what the API server would refuse is
refused first, naming the field: one copy for the config, the CLI and the domains."""

from __future__ import annotations

import re

__all__ = ["DNS_LABEL", "LABEL_NAME", "LABEL_NAME_PATTERN", "is_dns_label", "is_label_name"]

#: an RFC 1123 label: a namespace, a RuntimeClass handler (what the kubelet hands the CRI)
DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
#: a label value, or the name part of a label key: at most 63 characters, alphanumeric at both
#: ends, "-", "_" and "." inside (a pattern, for keys built around it)
LABEL_NAME_PATTERN = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_NAME = re.compile(LABEL_NAME_PATTERN)


def is_dns_label(value: str) -> bool:
    return DNS_LABEL.fullmatch(value) is not None


def is_label_name(value: str) -> bool:
    """A non-empty label value (an empty one is valid to the API server, never a name)."""
    return LABEL_NAME.fullmatch(value) is not None
