"""MIG geometry as the driver enforces it: placements, capacity, instance ids (reference/mig.md §1).

Everything here is pure: it reads a ``Gpu`` and its ``GpuModel`` and answers with NVML return
codes, placements or ids.

Two driver behaviours the reference leaves open are modelled on the MIG user guide's own
``nvidia-smi`` transcripts (getting-started page, A100-40GB) and other observed output:

* **Placement chosen by a create without placement** ("least damage"): among the free valid
  starts, the one that blocks the fewest still-free placements of all the GPU's profiles, ties
  going to the lowest start. It gives the guide's ``-cgi 9,19,14,19`` (4:4, 0:1, 2:2, 1:1),
  ``-cgi 14,19,19,19,19,19`` (4:2, 6:1, 0:1 ... 3:1) and its known issue: ``-cgi 19,19,14,9``
  fails with INSUFFICIENT_RESOURCES after placing 6:1, 4:1 and 0:2. It also matches A100
  ``-cgi 19`` x7 (6,4,5,0,1,2,3) and A30 ``-cgi 14,14,5`` (0:1, 1:1, 2:2).
* **GPU instance ids** are the index of the placement in a binary tree over the memory slices
  (0 = whole GPU, 1-2 = halves, 3-6 = quarters, 7-14 = eighths; A30: 0, 1-2, 3-6), which is
  every id in those transcripts (3g at 4:4 is GI 2, 2g at 2:2 is GI 4, 1g at 6:1 is GI 13).
  Ids are small and come back once their placement is free again.
* Compute instances created without a placement take the lowest free start and the lowest free
  CI id (the guide's ``-cci 0,0,0`` gives CIs 0, 1, 2; ``-cci 0`` in a fresh GI gives 0:1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import pynvml

from agent.gpu.models import CiProfileSpec, GiProfileSpec, GpuModel
from agent.gpu.sim.state import ComputeInstance, Gpu, GpuInstance

_Placement = tuple[int, int]  # (start, size)
_Instance = GpuInstance | ComputeInstance
_I = TypeVar("_I", bound=_Instance)
_Profile = GiProfileSpec | CiProfileSpec


def gi_spec(model: GpuModel, gi: GpuInstance) -> GiProfileSpec:
    spec = model.gi_profile_by_id(gi.profile_id)
    if spec is None:  # the state was written by this driver: a GI always has a known profile
        raise LookupError(f"GI {gi.id} has profile {gi.profile_id} unknown to {model.key}")
    return spec


def whole_gpu_profile(model: GpuModel) -> GiProfileSpec:
    """The profile spanning the whole GPU (7g, or 4g on A30): the board's engines and memory."""
    return max(model.gi_profiles, key=lambda p: (p.memory_slices, p.slice_count))


def gi_placements(spec: GiProfileSpec) -> list[_Placement]:
    return [(start, spec.memory_slices) for start in spec.starts]


def gi_id(model: GpuModel, start: int, size: int) -> int:
    """Binary-tree index of the memory range [start, start+size) (see module docstring)."""
    level = (model.memory_slices // size).bit_length() - 1
    return (1 << level) - 1 + start // size


def gi_create_error(gpu: Gpu, model: GpuModel, spec: GiProfileSpec, start: int) -> int | None:
    """Why a GI of ``spec`` at ``start`` cannot be created now, as an NVML code, or None."""
    error = _placement_error(gpu.gpu_instances, spec, (start, spec.memory_slices))
    if error is None and _media_conflict(gpu, model, spec):
        return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    return error


def choose_gi_start(gpu: Gpu, model: GpuModel, spec: GiProfileSpec) -> int | None:
    """Where the driver puts a GI created without a placement; None if nowhere."""
    free = [s for s in spec.starts if gi_create_error(gpu, model, spec, s) is None]
    everything = [p for other in model.gi_profiles for p in gi_placements(other)]
    return _least_damage(free, spec.memory_slices, everything, _ranges(gpu.gpu_instances))


def gi_remaining_capacity(gpu: Gpu, model: GpuModel, spec: GiProfileSpec) -> int:
    if _media_conflict(gpu, model, spec):
        return 0
    return _remaining(gpu.gpu_instances, spec, gi_placements(spec))


_MEDIA = ("+me", "+me.all")


def _media_conflict(gpu: Gpu, model: GpuModel, spec: GiProfileSpec) -> bool:
    """Media-engine rules: one +me or +me.all GI per GPU (mig.md §1.4); a +me.all GI takes every
    media engine, so it coexists only with -me GIs, either way round (nvml.h, ``_ALL_ME``)."""
    existing = [gi_spec(model, gi).attrs for gi in gpu.gpu_instances]
    if spec.attrs in _MEDIA and any(a in _MEDIA for a in existing):
        return True
    if spec.attrs == "+me.all" and any(a != "-me" for a in existing):
        return True
    return spec.attrs != "-me" and "+me.all" in existing


def ci_spec_by_id(model: GpuModel, gi: GpuInstance, profile_id: int) -> CiProfileSpec | None:
    return next((c for c in model.ci_profiles(gi_spec(model, gi)) if c.id == profile_id), None)


def ci_placements(spec: CiProfileSpec) -> list[_Placement]:
    return [(start, spec.slice_count) for start in spec.starts]


def ci_create_error(gi: GpuInstance, spec: CiProfileSpec, start: int) -> int | None:
    return _placement_error(gi.compute_instances, spec, (start, spec.slice_count))


def choose_ci_start(gi: GpuInstance, spec: CiProfileSpec) -> int | None:
    """Compute instances go to the lowest free start (``-cci 0`` in a 3g or a 2g GI gives 0:1)."""
    return next((s for s in spec.starts if ci_create_error(gi, spec, s) is None), None)


def ci_remaining_capacity(gi: GpuInstance, spec: CiProfileSpec) -> int:
    return _remaining(gi.compute_instances, spec, ci_placements(spec))


def next_ci_id(gi: GpuInstance) -> int:
    used = {ci.id for ci in gi.compute_instances}
    return next(i for i in range(len(used) + 1) if i not in used)


def mig_devices(gpu: Gpu) -> list[tuple[GpuInstance, ComputeInstance]]:
    """MIG devices in the order NVML indexes them: by GI id, then CI id (``nvidia-smi -L``)."""
    return [
        (gi, ci)
        for gi in sorted(gpu.gpu_instances, key=lambda g: g.id)
        for ci in sorted(gi.compute_instances, key=lambda c: c.id)
    ]


def of_profile(instances: Iterable[_I], profile_id: int) -> list[_I]:
    """The instances of one profile, by id: the order NVML lists them in."""
    return sorted((i for i in instances if i.profile_id == profile_id), key=lambda i: i.id)


# GPU instances on a GPU and compute instances inside a GI follow the same rules, each in its
# own unit (memory slices, compute slices): a profile's placements, its instance count, no overlap.


def _placement_error(
    existing: Sequence[_Instance], spec: _Profile, placement: _Placement
) -> int | None:
    if placement[0] not in spec.starts:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT
    if len(of_profile(existing, spec.id)) >= spec.instance_count:
        return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    if _overlaps(placement, _ranges(existing)):
        return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    return None


def _remaining(
    existing: Sequence[_Instance], spec: _Profile, placements: Sequence[_Placement]
) -> int:
    same = len(of_profile(existing, spec.id))
    fits = _disjoint_free(placements, _ranges(existing))
    return max(0, min(spec.instance_count - same, fits))


def _ranges(instances: Iterable[_Instance]) -> list[_Placement]:
    return [(i.start, i.size) for i in instances]


def _overlap(a: _Placement, b: _Placement) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _overlaps(p: _Placement, taken: Iterable[_Placement]) -> bool:
    return any(_overlap(p, t) for t in taken)


def _disjoint_free(candidates: Sequence[_Placement], taken: Sequence[_Placement]) -> int:
    """How many of ``candidates`` fit at once beside ``taken`` (greedy by start: exact for the
    equal-size, size-aligned placements every profile has)."""
    chosen: list[_Placement] = []
    for p in sorted(candidates):
        if not _overlaps(p, taken) and not _overlaps(p, chosen):
            chosen.append(p)
    return len(chosen)


def _least_damage(
    starts: Sequence[int],
    size: int,
    everything: Sequence[_Placement],
    taken: Sequence[_Placement],
) -> int | None:
    still_free = [p for p in everything if not _overlaps(p, taken)]

    def damage(start: int) -> tuple[int, int]:
        blocked = sum(1 for p in still_free if _overlap((start, size), p))
        return blocked, start

    return min(starts, key=damage, default=None)
