from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetPowerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuPower(_message.Message):
    __slots__ = ("index", "uuid", "name", "min_mw", "max_mw", "default_mw", "current_mw", "enforced_mw", "desired_mw", "baseline_mw")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_MW_FIELD_NUMBER: _ClassVar[int]
    MAX_MW_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MW_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MW_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_MW_FIELD_NUMBER: _ClassVar[int]
    DESIRED_MW_FIELD_NUMBER: _ClassVar[int]
    BASELINE_MW_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    min_mw: int
    max_mw: int
    default_mw: int
    current_mw: int
    enforced_mw: int
    desired_mw: int
    baseline_mw: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., min_mw: _Optional[int] = ..., max_mw: _Optional[int] = ..., default_mw: _Optional[int] = ..., current_mw: _Optional[int] = ..., enforced_mw: _Optional[int] = ..., desired_mw: _Optional[int] = ..., baseline_mw: _Optional[int] = ...) -> None: ...

class GetPowerResponse(_message.Message):
    __slots__ = ("gpus", "spec_yaml")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuPower]
    spec_yaml: str
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuPower, _Mapping]]] = ..., spec_yaml: _Optional[str] = ...) -> None: ...

class ApplyPowerRequest(_message.Message):
    __slots__ = ("spec_yaml", "request_id")
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec_yaml: str
    request_id: str
    def __init__(self, spec_yaml: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PowerChange(_message.Message):
    __slots__ = ("index", "uuid", "before_mw", "after_mw", "requested_mw")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_MW_FIELD_NUMBER: _ClassVar[int]
    AFTER_MW_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MW_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    before_mw: int
    after_mw: int
    requested_mw: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., before_mw: _Optional[int] = ..., after_mw: _Optional[int] = ..., requested_mw: _Optional[int] = ...) -> None: ...

class ApplyPowerResponse(_message.Message):
    __slots__ = ("changes", "lost_gpus", "unread_gpus")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    LOST_GPUS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_GPUS_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[PowerChange]
    lost_gpus: _containers.RepeatedCompositeFieldContainer[PowerLostGpu]
    unread_gpus: _containers.RepeatedCompositeFieldContainer[PowerLostGpu]
    def __init__(self, changes: _Optional[_Iterable[_Union[PowerChange, _Mapping]]] = ..., lost_gpus: _Optional[_Iterable[_Union[PowerLostGpu, _Mapping]]] = ..., unread_gpus: _Optional[_Iterable[_Union[PowerLostGpu, _Mapping]]] = ...) -> None: ...

class PowerLostGpu(_message.Message):
    __slots__ = ("index", "uuid", "unsure", "unread")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    UNSURE_FIELD_NUMBER: _ClassVar[int]
    UNREAD_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    unsure: str
    unread: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., unsure: _Optional[str] = ..., unread: _Optional[str] = ...) -> None: ...

class RestorePowerRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RestorePowerResponse(_message.Message):
    __slots__ = ("changes", "lost_gpus", "unread_gpus")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    LOST_GPUS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_GPUS_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[PowerChange]
    lost_gpus: _containers.RepeatedCompositeFieldContainer[PowerLostGpu]
    unread_gpus: _containers.RepeatedCompositeFieldContainer[PowerLostGpu]
    def __init__(self, changes: _Optional[_Iterable[_Union[PowerChange, _Mapping]]] = ..., lost_gpus: _Optional[_Iterable[_Union[PowerLostGpu, _Mapping]]] = ..., unread_gpus: _Optional[_Iterable[_Union[PowerLostGpu, _Mapping]]] = ...) -> None: ...
