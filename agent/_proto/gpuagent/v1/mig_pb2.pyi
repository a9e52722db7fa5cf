from agent._proto.gpuagent.v1 import operations_pb2 as _operations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MigPlanStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIG_PLAN_STATUS_UNSPECIFIED: _ClassVar[MigPlanStatus]
    MIG_PLAN_STATUS_UNCHANGED: _ClassVar[MigPlanStatus]
    MIG_PLAN_STATUS_CHANGE: _ClassVar[MigPlanStatus]
    MIG_PLAN_STATUS_BLOCKED: _ClassVar[MigPlanStatus]
    MIG_PLAN_STATUS_INFEASIBLE: _ClassVar[MigPlanStatus]
MIG_PLAN_STATUS_UNSPECIFIED: MigPlanStatus
MIG_PLAN_STATUS_UNCHANGED: MigPlanStatus
MIG_PLAN_STATUS_CHANGE: MigPlanStatus
MIG_PLAN_STATUS_BLOCKED: MigPlanStatus
MIG_PLAN_STATUS_INFEASIBLE: MigPlanStatus

class MigClaim(_message.Message):
    __slots__ = ("holder", "rollout", "max_unavailable", "expires_in_seconds", "operation")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    holder: str
    rollout: str
    max_unavailable: str
    expires_in_seconds: float
    operation: str
    def __init__(self, holder: _Optional[str] = ..., rollout: _Optional[str] = ..., max_unavailable: _Optional[str] = ..., expires_in_seconds: _Optional[float] = ..., operation: _Optional[str] = ...) -> None: ...

class ClaimMigRequest(_message.Message):
    __slots__ = ("holder", "rollout", "max_unavailable", "ttl_seconds")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    holder: str
    rollout: str
    max_unavailable: str
    ttl_seconds: int
    def __init__(self, holder: _Optional[str] = ..., rollout: _Optional[str] = ..., max_unavailable: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class ClaimMigResponse(_message.Message):
    __slots__ = ("claim",)
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    claim: MigClaim
    def __init__(self, claim: _Optional[_Union[MigClaim, _Mapping]] = ...) -> None: ...

class GetMigClaimRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetMigClaimResponse(_message.Message):
    __slots__ = ("claim",)
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    claim: MigClaim
    def __init__(self, claim: _Optional[_Union[MigClaim, _Mapping]] = ...) -> None: ...

class ReleaseMigClaimRequest(_message.Message):
    __slots__ = ("holder",)
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    holder: str
    def __init__(self, holder: _Optional[str] = ...) -> None: ...

class ReleaseMigClaimResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class MigBlocker(_message.Message):
    __slots__ = ("pid", "instance", "change")
    PID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    instance: str
    change: str
    def __init__(self, pid: _Optional[int] = ..., instance: _Optional[str] = ..., change: _Optional[str] = ...) -> None: ...

class GpuMigPlan(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "status", "steps", "blockers", "infeasible_reason", "keep", "destroy", "create", "deferred", "mode_pending", "entry", "gpu_name", "mode_change", "fits_instead", "keep_gpu_instance_ids", "destroy_gpu_instance_ids", "after", "memory_slices", "mig_parted_would_destroy", "free_region", "infeasible_profile", "collisions")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BLOCKERS_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_REASON_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    DESTROY_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    MODE_PENDING_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    FITS_INSTEAD_FIELD_NUMBER: _ClassVar[int]
    KEEP_GPU_INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    DESTROY_GPU_INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SLICES_FIELD_NUMBER: _ClassVar[int]
    MIG_PARTED_WOULD_DESTROY_FIELD_NUMBER: _ClassVar[int]
    FREE_REGION_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_PROFILE_FIELD_NUMBER: _ClassVar[int]
    COLLISIONS_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    status: MigPlanStatus
    steps: _containers.RepeatedScalarFieldContainer[str]
    blockers: _containers.RepeatedCompositeFieldContainer[MigBlocker]
    infeasible_reason: str
    keep: _containers.RepeatedScalarFieldContainer[str]
    destroy: _containers.RepeatedScalarFieldContainer[str]
    create: _containers.RepeatedScalarFieldContainer[str]
    deferred: bool
    mode_pending: str
    entry: str
    gpu_name: str
    mode_change: MigModeChange
    fits_instead: _containers.RepeatedCompositeFieldContainer[MigProfileCount]
    keep_gpu_instance_ids: _containers.RepeatedScalarFieldContainer[int]
    destroy_gpu_instance_ids: _containers.RepeatedScalarFieldContainer[int]
    after: _containers.RepeatedCompositeFieldContainer[MigPlannedInstance]
    memory_slices: int
    mig_parted_would_destroy: int
    free_region: str
    infeasible_profile: str
    collisions: _containers.RepeatedCompositeFieldContainer[MigCollision]
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., status: _Optional[_Union[MigPlanStatus, str]] = ..., steps: _Optional[_Iterable[str]] = ..., blockers: _Optional[_Iterable[_Union[MigBlocker, _Mapping]]] = ..., infeasible_reason: _Optional[str] = ..., keep: _Optional[_Iterable[str]] = ..., destroy: _Optional[_Iterable[str]] = ..., create: _Optional[_Iterable[str]] = ..., deferred: _Optional[bool] = ..., mode_pending: _Optional[str] = ..., entry: _Optional[str] = ..., gpu_name: _Optional[str] = ..., mode_change: _Optional[_Union[MigModeChange, _Mapping]] = ..., fits_instead: _Optional[_Iterable[_Union[MigProfileCount, _Mapping]]] = ..., keep_gpu_instance_ids: _Optional[_Iterable[int]] = ..., destroy_gpu_instance_ids: _Optional[_Iterable[int]] = ..., after: _Optional[_Iterable[_Union[MigPlannedInstance, _Mapping]]] = ..., memory_slices: _Optional[int] = ..., mig_parted_would_destroy: _Optional[int] = ..., free_region: _Optional[str] = ..., infeasible_profile: _Optional[str] = ..., collisions: _Optional[_Iterable[_Union[MigCollision, _Mapping]]] = ...) -> None: ...

class MigModeChange(_message.Message):
    __slots__ = ("enable", "reset_needed")
    ENABLE_FIELD_NUMBER: _ClassVar[int]
    RESET_NEEDED_FIELD_NUMBER: _ClassVar[int]
    enable: bool
    reset_needed: bool
    def __init__(self, enable: _Optional[bool] = ..., reset_needed: _Optional[bool] = ...) -> None: ...

class MigPlannedInstance(_message.Message):
    __slots__ = ("profile", "start", "size", "compute_instances", "kept")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    profile: str
    start: int
    size: int
    compute_instances: int
    kept: bool
    def __init__(self, profile: _Optional[str] = ..., start: _Optional[int] = ..., size: _Optional[int] = ..., compute_instances: _Optional[int] = ..., kept: _Optional[bool] = ...) -> None: ...

class MigCollision(_message.Message):
    __slots__ = ("placement", "blocked_by", "slices")
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    placement: str
    blocked_by: _containers.RepeatedScalarFieldContainer[str]
    slices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, placement: _Optional[str] = ..., blocked_by: _Optional[_Iterable[str]] = ..., slices: _Optional[_Iterable[int]] = ...) -> None: ...

class PlanMigRequest(_message.Message):
    __slots__ = ("config_yaml", "config_name", "force")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    config_name: str
    force: bool
    def __init__(self, config_yaml: _Optional[str] = ..., config_name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class PlanMigResponse(_message.Message):
    __slots__ = ("config_name", "gpus", "unselected_gpus", "skipped_gpus", "lost_gpus", "unread_gpus")
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UNSELECTED_GPUS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_GPUS_FIELD_NUMBER: _ClassVar[int]
    LOST_GPUS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_GPUS_FIELD_NUMBER: _ClassVar[int]
    config_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuMigPlan]
    unselected_gpus: _containers.RepeatedScalarFieldContainer[int]
    skipped_gpus: _containers.RepeatedScalarFieldContainer[int]
    lost_gpus: _containers.RepeatedScalarFieldContainer[int]
    unread_gpus: _containers.RepeatedCompositeFieldContainer[MigUnreadGpu]
    def __init__(self, config_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuMigPlan, _Mapping]]] = ..., unselected_gpus: _Optional[_Iterable[int]] = ..., skipped_gpus: _Optional[_Iterable[int]] = ..., lost_gpus: _Optional[_Iterable[int]] = ..., unread_gpus: _Optional[_Iterable[_Union[MigUnreadGpu, _Mapping]]] = ...) -> None: ...

class MigUnreadGpu(_message.Message):
    __slots__ = ("index", "unread")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UNREAD_FIELD_NUMBER: _ClassVar[int]
    index: int
    unread: str
    def __init__(self, index: _Optional[int] = ..., unread: _Optional[str] = ...) -> None: ...

class ApplyMigRequest(_message.Message):
    __slots__ = ("config_yaml", "config_name", "force", "request_id", "mode_only", "skip_reset", "claim_holder")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_ONLY_FIELD_NUMBER: _ClassVar[int]
    SKIP_RESET_FIELD_NUMBER: _ClassVar[int]
    CLAIM_HOLDER_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    config_name: str
    force: bool
    request_id: str
    mode_only: bool
    skip_reset: bool
    claim_holder: str
    def __init__(self, config_yaml: _Optional[str] = ..., config_name: _Optional[str] = ..., force: _Optional[bool] = ..., request_id: _Optional[str] = ..., mode_only: _Optional[bool] = ..., skip_reset: _Optional[bool] = ..., claim_holder: _Optional[str] = ...) -> None: ...

class ApplyMigResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: _operations_pb2.Operation
    def __init__(self, operation: _Optional[_Union[_operations_pb2.Operation, _Mapping]] = ...) -> None: ...

class AssertMigRequest(_message.Message):
    __slots__ = ("config_yaml", "config_name", "mode_only")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_ONLY_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    config_name: str
    mode_only: bool
    def __init__(self, config_yaml: _Optional[str] = ..., config_name: _Optional[str] = ..., mode_only: _Optional[bool] = ...) -> None: ...

class AssertMigResponse(_message.Message):
    __slots__ = ("matches", "mismatches", "config_name", "lost_gpus", "unread_gpus")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    LOST_GPUS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_GPUS_FIELD_NUMBER: _ClassVar[int]
    matches: bool
    mismatches: _containers.RepeatedScalarFieldContainer[str]
    config_name: str
    lost_gpus: _containers.RepeatedScalarFieldContainer[int]
    unread_gpus: _containers.RepeatedCompositeFieldContainer[MigUnreadGpu]
    def __init__(self, matches: _Optional[bool] = ..., mismatches: _Optional[_Iterable[str]] = ..., config_name: _Optional[str] = ..., lost_gpus: _Optional[_Iterable[int]] = ..., unread_gpus: _Optional[_Iterable[_Union[MigUnreadGpu, _Mapping]]] = ...) -> None: ...

class ExportMigRequest(_message.Message):
    __slots__ = ("config_name",)
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    config_name: str
    def __init__(self, config_name: _Optional[str] = ...) -> None: ...

class RestoreMigRequest(_message.Message):
    __slots__ = ("checkpoint", "mode_only", "request_id")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MODE_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint: bytes
    mode_only: bool
    request_id: str
    def __init__(self, checkpoint: _Optional[bytes] = ..., mode_only: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class RestoreMigResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: _operations_pb2.Operation
    def __init__(self, operation: _Optional[_Union[_operations_pb2.Operation, _Mapping]] = ...) -> None: ...

class ExportMigResponse(_message.Message):
    __slots__ = ("config_yaml",)
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    def __init__(self, config_yaml: _Optional[str] = ...) -> None: ...

class ResetGpuRequest(_message.Message):
    __slots__ = ("gpu_index", "validate_only", "request_id")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    validate_only: bool
    request_id: str
    def __init__(self, gpu_index: _Optional[int] = ..., validate_only: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResetGpuResponse(_message.Message):
    __slots__ = ("gpu_uuid", "reset")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    reset: bool
    def __init__(self, gpu_uuid: _Optional[str] = ..., reset: _Optional[bool] = ...) -> None: ...

class AdviseMigRequest(_message.Message):
    __slots__ = ("gpu_index", "profile")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    profile: str
    def __init__(self, gpu_index: _Optional[int] = ..., profile: _Optional[str] = ...) -> None: ...

class MigProfileCount(_message.Message):
    __slots__ = ("profile", "count")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    profile: str
    count: int
    def __init__(self, profile: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class MigPlacementAdvice(_message.Message):
    __slots__ = ("start", "size", "fits_after", "largest_after", "recommended")
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FITS_AFTER_FIELD_NUMBER: _ClassVar[int]
    LARGEST_AFTER_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_FIELD_NUMBER: _ClassVar[int]
    start: int
    size: int
    fits_after: _containers.RepeatedCompositeFieldContainer[MigProfileCount]
    largest_after: str
    recommended: bool
    def __init__(self, start: _Optional[int] = ..., size: _Optional[int] = ..., fits_after: _Optional[_Iterable[_Union[MigProfileCount, _Mapping]]] = ..., largest_after: _Optional[str] = ..., recommended: _Optional[bool] = ...) -> None: ...

class MigMove(_message.Message):
    __slots__ = ("profile", "gpu_instance_id", "from_start", "to_start", "busy")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_START_FIELD_NUMBER: _ClassVar[int]
    TO_START_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    profile: str
    gpu_instance_id: int
    from_start: int
    to_start: int
    busy: bool
    def __init__(self, profile: _Optional[str] = ..., gpu_instance_id: _Optional[int] = ..., from_start: _Optional[int] = ..., to_start: _Optional[int] = ..., busy: _Optional[bool] = ...) -> None: ...

class MigProfileAdvice(_message.Message):
    __slots__ = ("profile", "placements", "reason", "fragmented", "moves", "start_after_moves")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTED_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_MOVES_FIELD_NUMBER: _ClassVar[int]
    profile: str
    placements: _containers.RepeatedCompositeFieldContainer[MigPlacementAdvice]
    reason: str
    fragmented: bool
    moves: _containers.RepeatedCompositeFieldContainer[MigMove]
    start_after_moves: int
    def __init__(self, profile: _Optional[str] = ..., placements: _Optional[_Iterable[_Union[MigPlacementAdvice, _Mapping]]] = ..., reason: _Optional[str] = ..., fragmented: _Optional[bool] = ..., moves: _Optional[_Iterable[_Union[MigMove, _Mapping]]] = ..., start_after_moves: _Optional[int] = ...) -> None: ...

class GpuMigAdvice(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "model", "free_slices", "memory_slices", "fits_now", "profiles", "note")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FREE_SLICES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SLICES_FIELD_NUMBER: _ClassVar[int]
    FITS_NOW_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    model: str
    free_slices: _containers.RepeatedScalarFieldContainer[int]
    memory_slices: int
    fits_now: _containers.RepeatedCompositeFieldContainer[MigProfileCount]
    profiles: _containers.RepeatedCompositeFieldContainer[MigProfileAdvice]
    note: str
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., model: _Optional[str] = ..., free_slices: _Optional[_Iterable[int]] = ..., memory_slices: _Optional[int] = ..., fits_now: _Optional[_Iterable[_Union[MigProfileCount, _Mapping]]] = ..., profiles: _Optional[_Iterable[_Union[MigProfileAdvice, _Mapping]]] = ..., note: _Optional[str] = ...) -> None: ...

class AdviseMigResponse(_message.Message):
    __slots__ = ("gpus", "processes_hidden")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuMigAdvice]
    processes_hidden: bool
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuMigAdvice, _Mapping]]] = ..., processes_hidden: _Optional[bool] = ...) -> None: ...
