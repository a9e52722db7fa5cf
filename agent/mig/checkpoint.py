"""mig-parted's checkpoint file (its ``api/checkpoint/v1``): the exact MIG state of each GPU.

```json
{"Version": "v1", "MigState": {"Devices": [{"UUID": "GPU-...", "MigMode": 1,
  "GpuInstances": [{"ProfileID": 2, "Placement": {"Start": 4, "Size": 4},
    "ComputeInstances": [{"ProfileID": 2, "EngProfileID": 0,
                          "Placement": {"Start": 0, "Size": 3}}]}]}]}}
```

Written in mig-parted's JSON (Go's field names), so either tool restores the other's file. A
GPU instance's ``ProfileID`` is, as mig-parted writes and reads it, the NVML profile
**constant** (go-nvlib walks ``NVML_GPU_INSTANCE_PROFILE_*`` and passes the loop index on;
restore hands it to ``GetGpuInstanceProfileInfo``), not the id create takes: 3g is 2, not 9
(reference/mig.md §1.2). ``agent.mig.node_plan`` maps it to the GPU's id when restoring. A
compute instance's ``Placement`` is ours (mig-parted keeps none and ignores unknown fields);
read without it, a compute instance is created where the driver puts it, its width taken from its
profile id (CI profile ids are NVML's CI profile constants, reference/mig.md §1.2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent.errors import FieldViolation, InvalidSpec, NotSupported
from agent.gpu.types import GpuLayout, Placement
from agent.mig.state import CiState, GiState, GpuMigState, fetch

VERSION = "v1"
MAX_BYTES = 4 * 1024 * 1024
_MAX_GPUS = 64
_MAX_INSTANCES = 16
#: NVML_COMPUTE_INSTANCE_PROFILE_* constant (= profile id on hardware) -> compute slices.
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}


def checkpoint_document(layouts: Sequence[GpuLayout]) -> dict[str, Any]:
    """The checkpoint of ``layouts``: each GPU instance's profile by its NVML constant."""
    constants = {layout.gpu.uuid: {p.id: p.constant for p in layout.profiles} for layout in layouts}
    states = [fetch(layout) for layout in layouts]
    return {
        "Version": VERSION,
        "MigState": {
            "Devices": [
                {
                    "UUID": s.uuid,
                    "MigMode": 1 if s.mig_enabled else 0,
                    "GpuInstances": [
                        {
                            "ProfileID": _constant(constants[s.uuid], s.uuid, gi.profile_id),
                            "Placement": {"Start": gi.placement.start, "Size": gi.placement.size},
                            "ComputeInstances": [_ci(ci) for ci in gi.cis],
                        }
                        for gi in s.instances
                    ]
                    or None,  # Go writes a nil slice as null
                }
                for s in states
            ]
        },
    }


def _constant(constants: dict[int, int], uuid: str, profile_id: int) -> int:
    """The NVML constant of ``profile_id`` on this GPU, as mig-parted writes ``ProfileID``."""
    if profile_id not in constants:  # an instance of a profile the driver did not list
        raise NotSupported(
            f"GPU {uuid}: GPU instance profile id {profile_id} is under no profile constant "
            "the driver lists, so mig-parted could not restore it: no checkpoint written"
        )
    return constants[profile_id]


def _ci(ci: CiState) -> dict[str, Any]:
    out: dict[str, Any] = {"ProfileID": ci.profile_id, "EngProfileID": 0}
    if ci.start is not None:
        out["Placement"] = {"Start": ci.start, "Size": ci.slices}
    return out


def _ci_order(ci: CiState) -> tuple[int, int, int]:
    return (ci.slices, -1 if ci.start is None else ci.start, ci.profile_id or 0)


class _Bad(ValueError):
    """One problem of a checkpoint, at its field path (``MigState.Devices[0].MigMode``)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path, self.what = path, what


def parse_checkpoint(
    text: str | bytes, source: str = "<checkpoint>", field: str = "checkpoint-file"
) -> list[GpuMigState]:
    """The GPU states a checkpoint file holds; InvalidSpec naming ``field`` otherwise.

    GI profile names are filled in later from the GPU (the file has ids only): "" here.
    """
    if len(text) > MAX_BYTES:
        raise InvalidSpec(
            f"{source}: larger than {MAX_BYTES} bytes",
            [FieldViolation(field, f"at most {MAX_BYTES} bytes")],
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # deep nesting is a RecursionError
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise InvalidSpec(
            f"{source}: not a JSON checkpoint: {reason}", [FieldViolation(field, "JSON")]
        ) from exc
    try:
        return _states(data)
    except _Bad as exc:
        raise InvalidSpec(f"{source}: {exc}", [FieldViolation(exc.path, exc.what)]) from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidSpec(
            f"{source}: not a mig-parted v1 checkpoint ({exc!r})",
            [FieldViolation(field, "mig-parted checkpoint v1")],
        ) from exc


def _uint(value: Any, path: str) -> int:
    """An integer as Go's encoding/json reads one into mig-parted's fields (no string, bool or
    fraction), and one NVML's 32-bit unsigned ids and placements can carry."""
    if type(value) is float and value.is_integer():
        value = int(value)  # JSON has one number type: 2.0 is 2, as Go reads it
    if type(value) is not int or not 0 <= value < 2**32:
        raise _Bad(path, f"an integer 0 to 2**32-1, not {value!r}")
    return value


def _states(data: Any) -> list[GpuMigState]:
    if not isinstance(data, dict) or data.get("Version") != VERSION:
        raise ValueError("Version must be 'v1'")
    devices = data["MigState"]["Devices"] or []
    if not isinstance(devices, list) or len(devices) > _MAX_GPUS:
        raise ValueError(f"MigState.Devices: a list of at most {_MAX_GPUS}")
    return [_device(d, f"MigState.Devices[{i}]") for i, d in enumerate(devices)]


def _device(d: Any, path: str) -> GpuMigState:
    mode = _uint(d["MigMode"], f"{path}.MigMode")
    if mode not in (0, 1):
        raise _Bad(f"{path}.MigMode", "0 (disabled) or 1 (enabled)")
    gis = d.get("GpuInstances") or []
    if not isinstance(gis, list) or len(gis) > _MAX_INSTANCES:
        raise _Bad(f"{path}.GpuInstances", f"a list of at most {_MAX_INSTANCES}")
    if gis and mode == 0:  # the driver makes none with MIG off: refused before any change
        raise _Bad(f"{path}.GpuInstances", "must be empty with MigMode 0 (MIG disabled)")
    instances = []
    for j, gi in enumerate(gis):
        at = f"{path}.GpuInstances[{j}]"
        cis = [_ci_state(ci, f"{at}.ComputeInstances[{k}]") for k, ci in enumerate(_cis(gi, at))]
        place = gi["Placement"]
        instances.append(
            GiState(
                _uint(gi["ProfileID"], f"{at}.ProfileID"),
                "",
                Placement(
                    _uint(place["Start"], f"{at}.Placement.Start"),
                    _uint(place["Size"], f"{at}.Placement.Size"),
                ),
                tuple(sorted(cis, key=_ci_order)),
            )
        )
    return GpuMigState(
        str(d["UUID"]), mode == 1, tuple(sorted(instances, key=lambda g: g.placement))
    )


def _cis(gi: Any, path: str) -> list[Any]:
    cis = gi.get("ComputeInstances") or []
    if not isinstance(cis, list) or len(cis) > _MAX_INSTANCES:
        raise _Bad(f"{path}.ComputeInstances", f"a list of at most {_MAX_INSTANCES}")
    return cis


def _ci_state(ci: Any, path: str) -> CiState:
    profile = _uint(ci["ProfileID"], f"{path}.ProfileID")
    at = ci.get("Placement")
    if at is not None:
        return CiState(
            _uint(at["Size"], f"{path}.Placement.Size"),
            _uint(at["Start"], f"{path}.Placement.Start"),
            profile,
        )
    if profile not in CI_SLICES:
        raise _Bad(f"{path}.ProfileID", f"unknown compute instance profile id {profile}")
    return CiState(CI_SLICES[profile], None, profile)
