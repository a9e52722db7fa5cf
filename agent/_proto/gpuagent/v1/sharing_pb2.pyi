import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from agent._proto.gpuagent.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SharingStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARING_STRATEGY_UNSPECIFIED: _ClassVar[SharingStrategy]
    SHARING_STRATEGY_NONE: _ClassVar[SharingStrategy]
    SHARING_STRATEGY_TIME_SLICING: _ClassVar[SharingStrategy]
    SHARING_STRATEGY_MPS: _ClassVar[SharingStrategy]
SHARING_STRATEGY_UNSPECIFIED: SharingStrategy
SHARING_STRATEGY_NONE: SharingStrategy
SHARING_STRATEGY_TIME_SLICING: SharingStrategy
SHARING_STRATEGY_MPS: SharingStrategy

class SharedResource(_message.Message):
    __slots__ = ("name", "replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    replicas: int
    def __init__(self, name: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class SharingConfig(_message.Message):
    __slots__ = ("strategy", "mig_strategy", "rename_by_default", "fail_requests_greater_than_one", "resources", "config_yaml")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MIG_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RENAME_BY_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    FAIL_REQUESTS_GREATER_THAN_ONE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    strategy: SharingStrategy
    mig_strategy: str
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    resources: _containers.RepeatedCompositeFieldContainer[SharedResource]
    config_yaml: str
    def __init__(self, strategy: _Optional[_Union[SharingStrategy, str]] = ..., mig_strategy: _Optional[str] = ..., rename_by_default: _Optional[bool] = ..., fail_requests_greater_than_one: _Optional[bool] = ..., resources: _Optional[_Iterable[_Union[SharedResource, _Mapping]]] = ..., config_yaml: _Optional[str] = ...) -> None: ...

class SharingSpec(_message.Message):
    __slots__ = ("strategy", "resources", "rename_by_default", "fail_requests_greater_than_one", "mig_strategy")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RENAME_BY_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    FAIL_REQUESTS_GREATER_THAN_ONE_FIELD_NUMBER: _ClassVar[int]
    MIG_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    strategy: SharingStrategy
    resources: _containers.RepeatedCompositeFieldContainer[SharedResource]
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    mig_strategy: str
    def __init__(self, strategy: _Optional[_Union[SharingStrategy, str]] = ..., resources: _Optional[_Iterable[_Union[SharedResource, _Mapping]]] = ..., rename_by_default: _Optional[bool] = ..., fail_requests_greater_than_one: _Optional[bool] = ..., mig_strategy: _Optional[str] = ...) -> None: ...

class AdvertisedResource(_message.Message):
    __slots__ = ("resource", "devices", "replicas", "count")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    devices: int
    replicas: int
    count: int
    def __init__(self, resource: _Optional[str] = ..., devices: _Optional[int] = ..., replicas: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PluginReload(_message.Message):
    __slots__ = ("method", "done", "detail", "time", "pids")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    method: str
    done: bool
    detail: str
    time: _timestamp_pb2.Timestamp
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, method: _Optional[str] = ..., done: _Optional[bool] = ..., detail: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetSharingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSharingResponse(_message.Message):
    __slots__ = ("config", "config_path", "exists", "advertised", "plugin_state", "plugin_detail", "problems", "last_write", "dra", "advertised_unknown")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    ADVERTISED_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_STATE_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_DETAIL_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITE_FIELD_NUMBER: _ClassVar[int]
    DRA_FIELD_NUMBER: _ClassVar[int]
    ADVERTISED_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    config: SharingConfig
    config_path: str
    exists: bool
    advertised: _containers.RepeatedCompositeFieldContainer[AdvertisedResource]
    plugin_state: str
    plugin_detail: str
    problems: _containers.RepeatedCompositeFieldContainer[_types_pb2.FieldViolation]
    last_write: SharingWrite
    dra: DraSharing
    advertised_unknown: str
    def __init__(self, config: _Optional[_Union[SharingConfig, _Mapping]] = ..., config_path: _Optional[str] = ..., exists: _Optional[bool] = ..., advertised: _Optional[_Iterable[_Union[AdvertisedResource, _Mapping]]] = ..., plugin_state: _Optional[str] = ..., plugin_detail: _Optional[str] = ..., problems: _Optional[_Iterable[_Union[_types_pb2.FieldViolation, _Mapping]]] = ..., last_write: _Optional[_Union[SharingWrite, _Mapping]] = ..., dra: _Optional[_Union[DraSharing, _Mapping]] = ..., advertised_unknown: _Optional[str] = ...) -> None: ...

class DraSharing(_message.Message):
    __slots__ = ("mode", "evidence", "driver", "objects", "notes", "error")
    MODE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    mode: str
    evidence: str
    driver: str
    objects: _containers.RepeatedCompositeFieldContainer[DraObject]
    notes: _containers.RepeatedCompositeFieldContainer[_types_pb2.FieldViolation]
    error: str
    def __init__(self, mode: _Optional[str] = ..., evidence: _Optional[str] = ..., driver: _Optional[str] = ..., objects: _Optional[_Iterable[_Union[DraObject, _Mapping]]] = ..., notes: _Optional[_Iterable[_Union[_types_pb2.FieldViolation, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class DraObject(_message.Message):
    __slots__ = ("kind", "name", "namespace", "state", "json")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    namespace: str
    state: str
    json: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., state: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class SharingWrite(_message.Message):
    __slots__ = ("action", "write_time", "reload")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    WRITE_TIME_FIELD_NUMBER: _ClassVar[int]
    RELOAD_FIELD_NUMBER: _ClassVar[int]
    action: str
    write_time: _timestamp_pb2.Timestamp
    reload: PluginReload
    def __init__(self, action: _Optional[str] = ..., write_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reload: _Optional[_Union[PluginReload, _Mapping]] = ...) -> None: ...

class SharingChange(_message.Message):
    __slots__ = ("action", "changed", "config", "config_path", "advertised", "reload", "dra", "advertised_unknown", "problems")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    ADVERTISED_FIELD_NUMBER: _ClassVar[int]
    RELOAD_FIELD_NUMBER: _ClassVar[int]
    DRA_FIELD_NUMBER: _ClassVar[int]
    ADVERTISED_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    action: str
    changed: bool
    config: SharingConfig
    config_path: str
    advertised: _containers.RepeatedCompositeFieldContainer[AdvertisedResource]
    reload: PluginReload
    dra: DraSharing
    advertised_unknown: str
    problems: _containers.RepeatedCompositeFieldContainer[_types_pb2.FieldViolation]
    def __init__(self, action: _Optional[str] = ..., changed: _Optional[bool] = ..., config: _Optional[_Union[SharingConfig, _Mapping]] = ..., config_path: _Optional[str] = ..., advertised: _Optional[_Iterable[_Union[AdvertisedResource, _Mapping]]] = ..., reload: _Optional[_Union[PluginReload, _Mapping]] = ..., dra: _Optional[_Union[DraSharing, _Mapping]] = ..., advertised_unknown: _Optional[str] = ..., problems: _Optional[_Iterable[_Union[_types_pb2.FieldViolation, _Mapping]]] = ...) -> None: ...

class SetSharingRequest(_message.Message):
    __slots__ = ("spec", "config_yaml", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: SharingSpec
    config_yaml: str
    request_id: str
    def __init__(self, spec: _Optional[_Union[SharingSpec, _Mapping]] = ..., config_yaml: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SetSharingResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: SharingChange
    def __init__(self, change: _Optional[_Union[SharingChange, _Mapping]] = ...) -> None: ...

class ClearSharingRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ClearSharingResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: SharingChange
    def __init__(self, change: _Optional[_Union[SharingChange, _Mapping]] = ...) -> None: ...

class RollbackSharingRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RollbackSharingResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: SharingChange
    def __init__(self, change: _Optional[_Union[SharingChange, _Mapping]] = ...) -> None: ...
