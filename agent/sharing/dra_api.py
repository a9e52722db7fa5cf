"""NVIDIA's DRA driver sharing config (``resource.nvidia.com/v1beta1``): its rules, as the driver
applies them, so a config it would reject is refused before anything is written. Pure.

Facts, read in kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu) at
commit 95932046683719c43b6a0dd9613c2e5aad5d6703:

- ``api/nvidia.com/resource/v1beta1/api.go``: group ``resource.nvidia.com``, version
  ``v1beta1``; kinds ``GpuConfig``, ``MigDeviceConfig`` (and ``VfioDeviceConfig``,
  ``ComputeDomainChannelConfig``, ``ComputeDomainDaemonConfig``, not sharing). The kubelet
  plugin and the webhook decode opaque parameters with ``StrictDecoder``: an unknown field, a
  missing or unknown ``apiVersion``/``kind`` is an error.
- ``gpuconfig.go`` / ``migconfig.go``: ``GpuConfig{sharing *GpuSharing}``,
  ``MigDeviceConfig{sharing *MigDeviceSharing}``; no ``sharing`` is valid (nothing shared).
  ``Normalize``: strategy ``TimeSlicing`` without ``timeSlicingConfig`` gets
  ``{interval: Default}`` (GpuConfig only), strategy ``MPS`` without ``mpsConfig`` gets ``{}``;
  each only with its feature gate on.
- ``sharing.go``: ``GpuSharing{strategy, timeSlicingConfig, mpsConfig}``,
  ``MigDeviceSharing{strategy, mpsConfig}`` (no ``timeSlicingConfig``: strict decoding refuses
  it); strategies ``TimeSlicing``, ``MPS``; intervals ``Default``, ``Short``, ``Medium``,
  ``Long``; ``MpsConfig{defaultActiveThreadPercentage *int, defaultPinnedDeviceMemoryLimit
  *Quantity, defaultPerDevicePinnedMemoryLimit map[string]Quantity, multiUser *bool}``.
  ``GetTimeSlicingConfig`` refuses ``mpsConfig`` with TimeSlicing and ``GetMpsConfig`` refuses
  ``timeSlicingConfig`` with MPS (called when a claim is prepared, device_state.go
  applySharingConfig). ``MpsPerDevicePinnedMemoryLimit.Normalize(uuids, default)``: keys are a
  UUID of the claim's devices or an index into them, else ``invalid device``; each limit is
  written as ``<bytes / 2^20>M`` and must be at least 1 (``invalid limit``).
- ``validate.go``: a strategy other than the two is ``unknown GPU sharing strategy``; each needs
  its feature gate (``TimeSlicingSettings``, ``MPSSupport``), else ``"..." is selected as the GPU
  sharing strategy, but the "..." feature gate is not enabled``; an interval outside the four is
  ``unknown time-slice interval``; ``defaultActiveThreadPercentage`` must be 0..100.
  ``TimeSlicingConfig.Validate`` dereferences ``interval`` without a nil check, so
  ``timeSlicingConfig: {}`` crashes the validating call: refused here as a missing interval.
- ``pkg/featuregates/featuregates.go``: ``TimeSlicingSettings`` and ``MPSSupport`` are Alpha,
  default **off**: the driver must run with them on (Helm ``featureGates``) for any sharing.
- ``cmd/webhook/main.go``: the optional webhook (Helm ``webhook.enabled``, default false)
  validates ResourceClaims and ResourceClaimTemplates only, never a DeviceClass; a bad class
  config surfaces only when a claim using it is prepared.
- ``cmd/gpu-kubelet-plugin/device_state.go``: a claim's configs come after its class's and win;
  a ``GpuConfig`` that names a request given a MIG device (or a ``MigDeviceConfig`` given a full
  GPU) fails the claim; time-slicing settings are applied to full GPUs only (a MIG device
  accepts strategy TimeSlicing and nothing is set); MPS fails with the ``DynamicMIG`` gate on
  ("MPS is not yet supported when using featureGates.DynamicMIG=true") and with consumable
  shares.

The driver's API tests (``sharing_test.go`` TestMpsPerDevicePinnedMemoryLimitNormalize) and its
webhook tests (``cmd/webhook/main_test.go``) are rewritten as tests/fixtures/dra-driver-configs/
cases.yaml and run against this module by tests/unit/sharing/test_dra_parity.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction

from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import brief

DRIVER = "gpu.nvidia.com"
GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
SHARING_KINDS = (GPU_CONFIG, MIG_CONFIG)
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
STRATEGIES = (TIME_SLICING, MPS)
INTERVALS = ("Default", "Short", "Medium", "Long")
GATE_TIME_SLICING = "TimeSlicingSettings"
GATE_MPS = "MPSSupport"
#: What the agent assumes of the driver: sharing needs both gates on (docs/dra.md).
SHARING_GATES = frozenset({GATE_TIME_SLICING, GATE_MPS})
_GATE_OF = {TIME_SLICING: GATE_TIME_SLICING, MPS: GATE_MPS}

_TOP_KEYS = ("apiVersion", "kind", "sharing")
_SHARING_KEYS = {
    GPU_CONFIG: ("strategy", "timeSlicingConfig", "mpsConfig"),
    MIG_CONFIG: ("strategy", "mpsConfig"),
}
_MPS_KEYS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "multiUser",
)
MIB = 1 << 20
#: A Quantity longer than this is refused before it is parsed (the API's own are far shorter).
MAX_QUANTITY = 64
_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d{1,3})?"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: object) -> int:
    """A Kubernetes ``resource.Quantity`` as the whole number its ``Value()`` returns (rounded
    up). ValueError when it is not a quantity."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"must be a quantity such as 1Gi, got {brief(value)}")
    text = str(value).strip() if not isinstance(value, str) else value
    if len(text) > MAX_QUANTITY:
        raise ValueError(f"a quantity is at most {MAX_QUANTITY} characters")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"must be a quantity such as 1Gi or 512Mi, got {brief(value)}")
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:
        number *= Fraction(10) ** int(suffix[1:])
    return math.ceil(number)


def megabytes(quantity: object) -> str:
    """The driver's rendering of a pinned-memory limit: whole MiB, written ``<n>M``; ValueError
    when it is under 1 MiB (the driver's ``invalid limit``)."""
    value = parse_quantity(quantity)
    mib = value // MIB if value > 0 else 0  # Go's integer division of Value() by 1024 twice
    if mib <= 0:
        raise ValueError(f"under 1Mi ({brief(quantity)}): the driver refuses it (invalid limit)")
    return f"{mib}M"


def normalize_pinned_limits(
    per_device: Mapping[str, object], uuids: Sequence[str], default: object = None
) -> dict[str, str]:
    """``MpsPerDevicePinnedMemoryLimit.Normalize``: the limit per device UUID of a claim's
    devices. InvalidSpec naming the key for an unknown device or a limit under 1 MiB."""
    limits: dict[str, str] = {}
    at = "mpsConfig.defaultPerDevicePinnedMemoryLimit"
    if default is not None and uuids:
        try:
            value = megabytes(default)
        except ValueError as exc:
            raise InvalidSpec(
                "invalid limit",
                [FieldViolation("mpsConfig.defaultPinnedDeviceMemoryLimit", str(exc))],
            ) from None
        limits = dict.fromkeys(uuids, value)
    for key, quantity in per_device.items():
        device = _device_key(str(key), uuids)
        if device is None:
            raise InvalidSpec(
                "invalid device",
                [FieldViolation(f"{at}.{key}", f"names no device of the claim ({len(uuids)})")],
            )
        try:
            limits[device] = megabytes(quantity)
        except ValueError as exc:
            raise InvalidSpec("invalid limit", [FieldViolation(f"{at}.{key}", str(exc))]) from None
    return limits


def _device_key(key: str, uuids: Sequence[str]) -> str | None:
    if key in uuids:
        return key
    # strconv.Atoi: an optional sign and decimal digits.
    if not re.fullmatch(r"[+-]?\d{1,18}", key):
        return None
    index = int(key)
    return uuids[index] if 0 <= index < len(uuids) else None


def violations(
    parameters: object, at: str = "parameters", gates: Collection[str] = SHARING_GATES
) -> list[FieldViolation]:
    """Every reason the driver would refuse ``parameters`` (an opaque config's parameters) when
    it decodes, normalises, validates and applies them; empty when it takes them."""
    if not isinstance(parameters, Mapping):
        return [FieldViolation(at, f"must be an object, got {brief(parameters)}")]
    found: list[FieldViolation] = []
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION:
        found.append(
            FieldViolation(f"{at}.apiVersion", f"must be {API_VERSION}, got {brief(api_version)}")
        )
    if kind not in SHARING_KINDS:
        found.append(
            FieldViolation(
                f"{at}.kind", f"must be one of {', '.join(SHARING_KINDS)}, got {brief(kind)}"
            )
        )
        return found
    found += _unknown(parameters, at, _TOP_KEYS)
    sharing = parameters.get("sharing")
    if sharing is None:
        return found
    if not isinstance(sharing, Mapping):
        return [*found, FieldViolation(f"{at}.sharing", f"must be an object, got {brief(sharing)}")]
    return found + _sharing(sharing, f"{at}.sharing", str(kind), gates)


def _unknown(obj: Mapping[str, object], at: str, allowed: tuple[str, ...]) -> list[FieldViolation]:
    return [
        FieldViolation(
            f"{at}.{key}",
            f"unknown field (the driver decodes strictly); allowed: {', '.join(allowed)}",
        )
        for key in obj
        if key not in allowed
    ]


def _sharing(
    sharing: Mapping[str, object], at: str, kind: str, gates: Collection[str]
) -> list[FieldViolation]:
    found = _unknown(sharing, at, _SHARING_KEYS[kind])
    strategy = sharing.get("strategy")
    if strategy not in STRATEGIES:
        return [
            *found,
            FieldViolation(
                f"{at}.strategy",
                f"unknown GPU sharing strategy {brief(strategy)}; supported: "
                f"{', '.join(STRATEGIES)}",
            ),
        ]
    gate = _GATE_OF[str(strategy)]
    if gate not in gates:
        found.append(
            FieldViolation(
                f"{at}.strategy",
                f"{strategy} needs the driver's {gate} feature gate (off by default); the "
                "driver refuses it otherwise",
            )
        )
        return found
    tsc, mps = sharing.get("timeSlicingConfig"), sharing.get("mpsConfig")
    if strategy == TIME_SLICING:
        if mps is not None:
            found.append(
                FieldViolation(f"{at}.mpsConfig", "cannot be used with the TimeSlicing strategy")
            )
        if tsc is not None:
            found += _time_slicing(tsc, f"{at}.timeSlicingConfig")
    else:
        if tsc is not None:
            found.append(
                FieldViolation(f"{at}.timeSlicingConfig", "cannot be used with the MPS strategy")
            )
        if mps is not None:
            found += _mps(mps, f"{at}.mpsConfig")
    return found


def _time_slicing(tsc: object, at: str) -> list[FieldViolation]:
    if not isinstance(tsc, Mapping):
        return [FieldViolation(at, f"must be an object, got {brief(tsc)}")]
    found = _unknown(tsc, at, ("interval",))
    interval = tsc.get("interval")
    if interval is None:
        found.append(
            FieldViolation(
                f"{at}.interval",
                "required when timeSlicingConfig is given (the driver's validation "
                "dereferences it unchecked); leave timeSlicingConfig out for Default",
            )
        )
    elif interval not in INTERVALS:
        found.append(
            FieldViolation(
                f"{at}.interval",
                f"unknown time-slice interval {brief(interval)}; supported: {', '.join(INTERVALS)}",
            )
        )
    return found


def _mps(mps: object, at: str) -> list[FieldViolation]:
    if not isinstance(mps, Mapping):
        return [FieldViolation(at, f"must be an object, got {brief(mps)}")]
    found = _unknown(mps, at, _MPS_KEYS)
    pct = mps.get("defaultActiveThreadPercentage")
    if pct is not None:
        if isinstance(pct, bool) or not isinstance(pct, int):
            found.append(
                FieldViolation(
                    f"{at}.defaultActiveThreadPercentage", f"must be an integer, got {brief(pct)}"
                )
            )
        elif not 0 <= pct <= 100:
            found.append(
                FieldViolation(
                    f"{at}.defaultActiveThreadPercentage",
                    f"active thread percentage must be 0 to 100, got {pct}",
                )
            )
    user = mps.get("multiUser")
    if user is not None and not isinstance(user, bool):
        found.append(FieldViolation(f"{at}.multiUser", f"must be true or false, got {brief(user)}"))
    limit = mps.get("defaultPinnedDeviceMemoryLimit")
    if limit is not None:
        try:
            megabytes(limit)
        except ValueError as exc:
            found.append(FieldViolation(f"{at}.defaultPinnedDeviceMemoryLimit", str(exc)))
    per_device = mps.get("defaultPerDevicePinnedMemoryLimit")
    if per_device is not None:
        if not isinstance(per_device, Mapping):
            found.append(
                FieldViolation(
                    f"{at}.defaultPerDevicePinnedMemoryLimit",
                    f"must be a map of device index or UUID to a quantity, got {brief(per_device)}",
                )
            )
        else:
            for key, value in per_device.items():
                try:
                    megabytes(value)
                except ValueError as exc:
                    found.append(
                        FieldViolation(f"{at}.defaultPerDevicePinnedMemoryLimit.{key}", str(exc))
                    )
    return found
