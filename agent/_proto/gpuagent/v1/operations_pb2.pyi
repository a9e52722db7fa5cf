import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from agent._proto.gpuagent.v1 import cache_pb2 as _cache_pb2
from agent._proto.gpuagent.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_PENDING: _ClassVar[OperationState]
    OPERATION_STATE_RUNNING: _ClassVar[OperationState]
    OPERATION_STATE_SUCCEEDED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]
    OPERATION_STATE_CANCELLED: _ClassVar[OperationState]
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_PENDING: OperationState
OPERATION_STATE_RUNNING: OperationState
OPERATION_STATE_SUCCEEDED: OperationState
OPERATION_STATE_FAILED: OperationState
OPERATION_STATE_CANCELLED: OperationState

class Operation(_message.Message):
    __slots__ = ("name", "kind", "state", "done", "metadata", "error", "response", "request_id", "create_time", "update_time", "cancel_requested", "failed_response")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    state: OperationState
    done: bool
    metadata: OperationMetadata
    error: OperationError
    response: OperationResponse
    request_id: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    cancel_requested: bool
    failed_response: OperationResponse
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., state: _Optional[_Union[OperationState, str]] = ..., done: _Optional[bool] = ..., metadata: _Optional[_Union[OperationMetadata, _Mapping]] = ..., error: _Optional[_Union[OperationError, _Mapping]] = ..., response: _Optional[_Union[OperationResponse, _Mapping]] = ..., request_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ..., failed_response: _Optional[_Union[OperationResponse, _Mapping]] = ...) -> None: ...

class OperationError(_message.Message):
    __slots__ = ("code", "reason", "message", "blockers", "violations")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCKERS_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    blockers: _containers.RepeatedScalarFieldContainer[str]
    violations: _containers.RepeatedCompositeFieldContainer[_types_pb2.FieldViolation]
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., blockers: _Optional[_Iterable[str]] = ..., violations: _Optional[_Iterable[_Union[_types_pb2.FieldViolation, _Mapping]]] = ...) -> None: ...

class OperationMetadata(_message.Message):
    __slots__ = ("mig_apply", "prewarm")
    MIG_APPLY_FIELD_NUMBER: _ClassVar[int]
    PREWARM_FIELD_NUMBER: _ClassVar[int]
    mig_apply: MigApplyProgress
    prewarm: PrewarmProgress
    def __init__(self, mig_apply: _Optional[_Union[MigApplyProgress, _Mapping]] = ..., prewarm: _Optional[_Union[PrewarmProgress, _Mapping]] = ...) -> None: ...

class OperationResponse(_message.Message):
    __slots__ = ("mig_apply", "prewarm")
    MIG_APPLY_FIELD_NUMBER: _ClassVar[int]
    PREWARM_FIELD_NUMBER: _ClassVar[int]
    mig_apply: MigApplyResult
    prewarm: PrewarmResult
    def __init__(self, mig_apply: _Optional[_Union[MigApplyResult, _Mapping]] = ..., prewarm: _Optional[_Union[PrewarmResult, _Mapping]] = ...) -> None: ...

class MigApplyProgress(_message.Message):
    __slots__ = ("config_name", "phase", "gpus_total", "gpus_done", "steps_total", "steps_done", "current_step", "current_gpu_index", "gpus_done_indices")
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_DONE_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    CURRENT_GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPUS_DONE_INDICES_FIELD_NUMBER: _ClassVar[int]
    config_name: str
    phase: str
    gpus_total: int
    gpus_done: int
    steps_total: int
    steps_done: int
    current_step: str
    current_gpu_index: int
    gpus_done_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, config_name: _Optional[str] = ..., phase: _Optional[str] = ..., gpus_total: _Optional[int] = ..., gpus_done: _Optional[int] = ..., steps_total: _Optional[int] = ..., steps_done: _Optional[int] = ..., current_step: _Optional[str] = ..., current_gpu_index: _Optional[int] = ..., gpus_done_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class MigApplyResult(_message.Message):
    __slots__ = ("config_name", "changed_gpu_uuids", "changed", "gpus", "mutations", "recovered", "device_plugin", "assert_mismatches")
    CONFIG_NAME_FIELD_NUMBER: _ClassVar[int]
    CHANGED_GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_PLUGIN_FIELD_NUMBER: _ClassVar[int]
    ASSERT_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    config_name: str
    changed_gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    changed: bool
    gpus: _containers.RepeatedCompositeFieldContainer[MigGpuOutcome]
    mutations: int
    recovered: _containers.RepeatedScalarFieldContainer[str]
    device_plugin: str
    assert_mismatches: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, config_name: _Optional[str] = ..., changed_gpu_uuids: _Optional[_Iterable[str]] = ..., changed: _Optional[bool] = ..., gpus: _Optional[_Iterable[_Union[MigGpuOutcome, _Mapping]]] = ..., mutations: _Optional[int] = ..., recovered: _Optional[_Iterable[str]] = ..., device_plugin: _Optional[str] = ..., assert_mismatches: _Optional[_Iterable[str]] = ...) -> None: ...

class MigGpuOutcome(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "status", "kept", "destroyed", "created", "message")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DESTROYED_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    status: str
    kept: int
    destroyed: int
    created: int
    message: str
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., status: _Optional[str] = ..., kept: _Optional[int] = ..., destroyed: _Optional[int] = ..., created: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PrewarmProgress(_message.Message):
    __slots__ = ("items", "items_total", "items_done")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_DONE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PrewarmItemProgress]
    items_total: int
    items_done: int
    def __init__(self, items: _Optional[_Iterable[_Union[PrewarmItemProgress, _Mapping]]] = ..., items_total: _Optional[int] = ..., items_done: _Optional[int] = ...) -> None: ...

class PrewarmItemProgress(_message.Message):
    __slots__ = ("item_id", "name", "state", "done_bytes", "total_bytes", "rate_bytes_per_second", "eta_seconds", "retrying")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RATE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRYING_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    name: str
    state: _cache_pb2.CacheItemState
    done_bytes: int
    total_bytes: int
    rate_bytes_per_second: float
    eta_seconds: float
    retrying: str
    def __init__(self, item_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[_cache_pb2.CacheItemState, str]] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., rate_bytes_per_second: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., retrying: _Optional[str] = ...) -> None: ...

class PrewarmResult(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_cache_pb2.CacheItem]
    def __init__(self, items: _Optional[_Iterable[_Union[_cache_pb2.CacheItem, _Mapping]]] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class ListOperationsRequest(_message.Message):
    __slots__ = ("kind", "done", "page_size", "page_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: str
    done: bool
    page_size: int
    page_token: str
    def __init__(self, kind: _Optional[str] = ..., done: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListOperationsResponse(_message.Message):
    __slots__ = ("operations", "next_page_token")
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    next_page_token: str
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WaitOperationRequest(_message.Message):
    __slots__ = ("name", "timeout")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    timeout: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class CancelOperationRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CancelOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class WatchOperationRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class WatchOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...
