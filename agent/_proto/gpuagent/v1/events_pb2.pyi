import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from agent._proto.gpuagent.v1 import agent_pb2 as _agent_pb2
from agent._proto.gpuagent.v1 import operations_pb2 as _operations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_OPERATION: _ClassVar[EventType]
    EVENT_TYPE_MIG_LAYOUT: _ClassVar[EventType]
    EVENT_TYPE_XID: _ClassVar[EventType]
    EVENT_TYPE_GPU_LOST: _ClassVar[EventType]
    EVENT_TYPE_HEALTH: _ClassVar[EventType]
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_OPERATION: EventType
EVENT_TYPE_MIG_LAYOUT: EventType
EVENT_TYPE_XID: EventType
EVENT_TYPE_GPU_LOST: EventType
EVENT_TYPE_HEALTH: EventType

class WatchEventsRequest(_message.Message):
    __slots__ = ("types",)
    TYPES_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[EventType]
    def __init__(self, types: _Optional[_Iterable[_Union[EventType, str]]] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: Event
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("sequence", "time", "operation", "mig_layout", "xid", "gpu_lost", "health")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    MIG_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    GPU_LOST_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: _timestamp_pb2.Timestamp
    operation: _operations_pb2.Operation
    mig_layout: MigLayoutEvent
    xid: XidEvent
    gpu_lost: GpuLostEvent
    health: HealthEvent
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., operation: _Optional[_Union[_operations_pb2.Operation, _Mapping]] = ..., mig_layout: _Optional[_Union[MigLayoutEvent, _Mapping]] = ..., xid: _Optional[_Union[XidEvent, _Mapping]] = ..., gpu_lost: _Optional[_Union[GpuLostEvent, _Mapping]] = ..., health: _Optional[_Union[HealthEvent, _Mapping]] = ...) -> None: ...

class MigLayoutEvent(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "mig_mode", "instances")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_MODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    mig_mode: _agent_pb2.MigMode
    instances: _containers.RepeatedCompositeFieldContainer[_agent_pb2.GpuInstance]
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., mig_mode: _Optional[_Union[_agent_pb2.MigMode, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[_agent_pb2.GpuInstance, _Mapping]]] = ...) -> None: ...

class XidEvent(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "gpu_instance_id", "xid", "message", "count")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    gpu_instance_id: int
    xid: int
    message: str
    count: int
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., gpu_instance_id: _Optional[int] = ..., xid: _Optional[int] = ..., message: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class GpuLostEvent(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "detail")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    detail: str
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "gpu_instance_id", "previous", "mark", "held")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    gpu_instance_id: int
    previous: _agent_pb2.HealthState
    mark: _agent_pb2.HealthMark
    held: bool
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., gpu_instance_id: _Optional[int] = ..., previous: _Optional[_Union[_agent_pb2.HealthState, str]] = ..., mark: _Optional[_Union[_agent_pb2.HealthMark, _Mapping]] = ..., held: _Optional[bool] = ...) -> None: ...
