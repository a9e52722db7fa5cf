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
    __slots__ = ("gpu_index", "gpu_uuid", "status", "steps", "blockers", "infeasible_reason", "keep", "destroy", "create", "deferred")
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
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., status: _Optional[_Union[MigPlanStatus, str]] = ..., steps: _Optional[_Iterable[str]] = ..., blockers: _Optional[_Iterable[_Union[MigBlocker, _Mapping]]] = ..., infeasible_reason: _Optional[str] = ..., keep: _Optional[_Iterable[str]] = ..., destroy: _Optional[_Iterable[str]] = ..., create: _Optional[_Iterable[str]] = ..., deferred: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("config_name", "gpus", "unselected_gpus", "skipped_gpus")
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UNSELECTED_GPUS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_GPUS_FIELD_NUMBER: _ClassVar[int]
    config_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuMigPlan]
    unselected_gpus: _containers.RepeatedScalarFieldContainer[int]
    skipped_gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, config_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuMigPlan, _Mapping]]] = ..., unselected_gpus: _Optional[_Iterable[int]] = ..., skipped_gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class ApplyMigRequest(_message.Message):
    __slots__ = ("config_yaml", "config_name", "force", "request_id", "mode_only", "skip_reset")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_ONLY_FIELD_NUMBER: _ClassVar[int]
    SKIP_RESET_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    config_name: str
    force: bool
    request_id: str
    mode_only: bool
    skip_reset: bool
    def __init__(self, config_yaml: _Optional[str] = ..., config_name: _Optional[str] = ..., force: _Optional[bool] = ..., request_id: _Optional[str] = ..., mode_only: _Optional[bool] = ..., skip_reset: _Optional[bool] = ...) -> None: ...

class ApplyMigResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: _operations_pb2.Operation
    def __init__(self, operation: _Optional[_Union[_operations_pb2.Operation, _Mapping]] = ...) -> None: ...

class AssertMigRequest(_message.Message):
    __slots__ = ("config_yaml", "config_name")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    config_name: str
    def __init__(self, config_yaml: _Optional[str] = ..., config_name: _Optional[str] = ...) -> None: ...

class AssertMigResponse(_message.Message):
    __slots__ = ("matches", "mismatches", "config_name")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    matches: bool
    mismatches: _containers.RepeatedScalarFieldContainer[str]
    config_name: str
    def __init__(self, matches: _Optional[bool] = ..., mismatches: _Optional[_Iterable[str]] = ..., config_name: _Optional[str] = ...) -> None: ...

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
