"""mig-parted's checkpoint file (its ``api/checkpoint/v1``): the exact MIG state of each GPU.

```json
{"Version": "v1", "MigState": {"Devices": [{"UUID": "GPU-...", "MigMode": 1,
  "GpuInstances": [{"ProfileID": 9, "Placement": {"Start": 4, "Size": 4},
    "ComputeInstances": [{"ProfileID": 2, "EngProfileID": 0,
                          "Placement": {"Start": 0, "Size": 3}}]}]}]}}
```

Written in mig-parted's JSON (Go's field names), so either tool restores the other's file. A
compute instance's ``Placement`` is ours (mig-parted keeps none and ignores unknown fields);
read without it, a compute instance is created where the driver puts it, its width taken from its
profile id (CI profile ids are NVML's CI profile constants, reference/mig.md §1.2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import Placement
from agent.mig.state import CiState, GiState, GpuMigState

VERSION = "v1"
_MAX_BYTES = 4 * 1024 * 1024
_MAX_GPUS = 64
_MAX_INSTANCES = 16
#: NVML_COMPUTE_INSTANCE_PROFILE_* constant (= profile id on hardware) -> compute slices.
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}


def checkpoint_document(states: Sequence[GpuMigState]) -> dict[str, Any]:
    return {
        "Version": VERSION,
        "MigState": {
            "Devices": [
                {
                    "UUID": s.uuid,
                    "MigMode": 1 if s.mig_enabled else 0,
                    "GpuInstances": [
                        {
                            "ProfileID": gi.profile_id,
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


def _ci(ci: CiState) -> dict[str, Any]:
    out: dict[str, Any] = {"ProfileID": ci.profile_id, "EngProfileID": 0}
    if ci.start is not None:
        out["Placement"] = {"Start": ci.start, "Size": ci.slices}
    return out


def _ci_order(ci: CiState) -> tuple[int, int, int]:
    return (ci.slices, -1 if ci.start is None else ci.start, ci.profile_id or 0)


def parse_checkpoint(
    text: str | bytes, source: str = "<checkpoint>", field: str = "checkpoint-file"
) -> list[GpuMigState]:
    """The GPU states a checkpoint file holds; InvalidSpec naming ``field`` otherwise.

    GI profile names are filled in later from the GPU (the file has ids only): "" here.
    """
    if len(text) > _MAX_BYTES:
        raise InvalidSpec(
            f"{source}: larger than {_MAX_BYTES} bytes",
            [FieldViolation(field, f"at most {_MAX_BYTES} bytes")],
        )
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidSpec(
            f"{source}: not a JSON checkpoint: {exc}", [FieldViolation(field, "JSON")]
        ) from exc
    try:
        return _states(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidSpec(
            f"{source}: not a mig-parted v1 checkpoint ({exc!r})",
            [FieldViolation(field, "mig-parted checkpoint v1")],
        ) from exc


def _states(data: Any) -> list[GpuMigState]:
    if not isinstance(data, dict) or data.get("Version") != VERSION:
        raise ValueError("Version must be 'v1'")
    devices = data["MigState"]["Devices"] or []
    if not isinstance(devices, list) or len(devices) > _MAX_GPUS:
        raise ValueError(f"MigState.Devices: a list of at most {_MAX_GPUS}")
    out = []
    for d in devices:
        mode = int(d["MigMode"])
        if mode not in (0, 1):
            raise ValueError("MigMode must be 0 or 1")
        gis = d.get("GpuInstances") or []
        if len(gis) > _MAX_INSTANCES:
            raise ValueError(f"GpuInstances: at most {_MAX_INSTANCES}")
        instances = []
        for gi in gis:
            cis = []
            for ci in gi.get("ComputeInstances") or []:
                profile = int(ci["ProfileID"])
                at = ci.get("Placement")
                if at is not None:
                    cis.append(CiState(int(at["Size"]), int(at["Start"]), profile))
                elif profile in CI_SLICES:
                    cis.append(CiState(CI_SLICES[profile], None, profile))
                else:
                    raise ValueError(f"unknown compute instance profile id {profile}")
            if len(cis) > _MAX_INSTANCES:
                raise ValueError(f"ComputeInstances: at most {_MAX_INSTANCES}")
            place = gi["Placement"]
            instances.append(
                GiState(
                    int(gi["ProfileID"]),
                    "",
                    Placement(int(place["Start"]), int(place["Size"])),
                    tuple(sorted(cis, key=_ci_order)),
                )
            )
        out.append(
            GpuMigState(
                str(d["UUID"]), mode == 1, tuple(sorted(instances, key=lambda g: g.placement))
            )
        )
    return out
