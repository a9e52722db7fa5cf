import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetMetricsRequest(_message.Message):
    __slots__ = ("openmetrics",)
    OPENMETRICS_FIELD_NUMBER: _ClassVar[int]
    openmetrics: bool
    def __init__(self, openmetrics: _Optional[bool] = ...) -> None: ...

class GetMetricsResponse(_message.Message):
    __slots__ = ("body", "content_type", "sample_time")
    BODY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_TIME_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    content_type: str
    sample_time: _timestamp_pb2.Timestamp
    def __init__(self, body: _Optional[bytes] = ..., content_type: _Optional[str] = ..., sample_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetTelemetrySnapshotRequest(_message.Message):
    __slots__ = ("field_ids",)
    FIELD_IDS_FIELD_NUMBER: _ClassVar[int]
    field_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, field_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetTelemetrySnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: TelemetrySnapshot
    def __init__(self, snapshot: _Optional[_Union[TelemetrySnapshot, _Mapping]] = ...) -> None: ...

class TelemetrySnapshot(_message.Message):
    __slots__ = ("time", "hostname", "driver_version", "gpus", "entities", "xids", "pods_hidden", "pods", "sources")
    TIME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    PODS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    hostname: str
    driver_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuUp]
    entities: _containers.RepeatedCompositeFieldContainer[EntitySample]
    xids: _containers.RepeatedCompositeFieldContainer[XidCount]
    pods_hidden: bool
    pods: _containers.RepeatedCompositeFieldContainer[PodUsage]
    sources: _containers.RepeatedCompositeFieldContainer[SourceState]
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hostname: _Optional[str] = ..., driver_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuUp, _Mapping]]] = ..., entities: _Optional[_Iterable[_Union[EntitySample, _Mapping]]] = ..., xids: _Optional[_Iterable[_Union[XidCount, _Mapping]]] = ..., pods_hidden: _Optional[bool] = ..., pods: _Optional[_Iterable[_Union[PodUsage, _Mapping]]] = ..., sources: _Optional[_Iterable[_Union[SourceState, _Mapping]]] = ...) -> None: ...

class SourceState(_message.Message):
    __slots__ = ("source", "up", "reason")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    source: str
    up: bool
    reason: str
    def __init__(self, source: _Optional[str] = ..., up: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class GpuUp(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "up")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    up: bool
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., up: _Optional[bool] = ...) -> None: ...

class TelemetryEntity(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "gpu_instance_id", "profile")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    gpu_instance_id: int
    profile: str
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., gpu_instance_id: _Optional[int] = ..., profile: _Optional[str] = ...) -> None: ...

class PodRef(_message.Message):
    __slots__ = ("namespace", "name", "container")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    container: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., container: _Optional[str] = ...) -> None: ...

class FieldValue(_message.Message):
    __slots__ = ("field_id", "name", "value")
    FIELD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    field_id: int
    name: str
    value: float
    def __init__(self, field_id: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class EntitySample(_message.Message):
    __slots__ = ("entity", "values", "pod", "idle_seconds")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    entity: TelemetryEntity
    values: _containers.RepeatedCompositeFieldContainer[FieldValue]
    pod: PodRef
    idle_seconds: float
    def __init__(self, entity: _Optional[_Union[TelemetryEntity, _Mapping]] = ..., values: _Optional[_Iterable[_Union[FieldValue, _Mapping]]] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., idle_seconds: _Optional[float] = ...) -> None: ...

class PodUsage(_message.Message):
    __slots__ = ("entity", "pod", "memory_used_bytes", "sm_utilization")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    entity: TelemetryEntity
    pod: PodRef
    memory_used_bytes: float
    sm_utilization: float
    def __init__(self, entity: _Optional[_Union[TelemetryEntity, _Mapping]] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., memory_used_bytes: _Optional[float] = ..., sm_utilization: _Optional[float] = ...) -> None: ...

class XidCount(_message.Message):
    __slots__ = ("entity", "xid", "count")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    entity: TelemetryEntity
    xid: int
    count: int
    def __init__(self, entity: _Optional[_Union[TelemetryEntity, _Mapping]] = ..., xid: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...
