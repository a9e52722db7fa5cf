import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheItemKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_ITEM_KIND_UNSPECIFIED: _ClassVar[CacheItemKind]
    CACHE_ITEM_KIND_FILE: _ClassVar[CacheItemKind]
    CACHE_ITEM_KIND_IMAGE: _ClassVar[CacheItemKind]
    CACHE_ITEM_KIND_GROUP: _ClassVar[CacheItemKind]

class CacheItemState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_ITEM_STATE_UNSPECIFIED: _ClassVar[CacheItemState]
    CACHE_ITEM_STATE_QUEUED: _ClassVar[CacheItemState]
    CACHE_ITEM_STATE_FETCHING: _ClassVar[CacheItemState]
    CACHE_ITEM_STATE_READY: _ClassVar[CacheItemState]
    CACHE_ITEM_STATE_FAILED: _ClassVar[CacheItemState]
    CACHE_ITEM_STATE_EVICTED: _ClassVar[CacheItemState]

class ImageWarmthLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_WARMTH_LEVEL_UNSPECIFIED: _ClassVar[ImageWarmthLevel]
    IMAGE_WARMTH_LEVEL_FULL: _ClassVar[ImageWarmthLevel]
    IMAGE_WARMTH_LEVEL_PARTIAL: _ClassVar[ImageWarmthLevel]
    IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY: _ClassVar[ImageWarmthLevel]
    IMAGE_WARMTH_LEVEL_UNKNOWN: _ClassVar[ImageWarmthLevel]
CACHE_ITEM_KIND_UNSPECIFIED: CacheItemKind
CACHE_ITEM_KIND_FILE: CacheItemKind
CACHE_ITEM_KIND_IMAGE: CacheItemKind
CACHE_ITEM_KIND_GROUP: CacheItemKind
CACHE_ITEM_STATE_UNSPECIFIED: CacheItemState
CACHE_ITEM_STATE_QUEUED: CacheItemState
CACHE_ITEM_STATE_FETCHING: CacheItemState
CACHE_ITEM_STATE_READY: CacheItemState
CACHE_ITEM_STATE_FAILED: CacheItemState
CACHE_ITEM_STATE_EVICTED: CacheItemState
IMAGE_WARMTH_LEVEL_UNSPECIFIED: ImageWarmthLevel
IMAGE_WARMTH_LEVEL_FULL: ImageWarmthLevel
IMAGE_WARMTH_LEVEL_PARTIAL: ImageWarmthLevel
IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY: ImageWarmthLevel
IMAGE_WARMTH_LEVEL_UNKNOWN: ImageWarmthLevel

class ImageWarmth(_message.Message):
    __slots__ = ("level", "lazy", "blobs_total", "blobs_warm", "bytes_total", "bytes_warm")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LAZY_FIELD_NUMBER: _ClassVar[int]
    BLOBS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOBS_WARM_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_WARM_FIELD_NUMBER: _ClassVar[int]
    level: ImageWarmthLevel
    lazy: bool
    blobs_total: int
    blobs_warm: int
    bytes_total: int
    bytes_warm: int
    def __init__(self, level: _Optional[_Union[ImageWarmthLevel, str]] = ..., lazy: _Optional[bool] = ..., blobs_total: _Optional[int] = ..., blobs_warm: _Optional[int] = ..., bytes_total: _Optional[int] = ..., bytes_warm: _Optional[int] = ...) -> None: ...

class CacheItem(_message.Message):
    __slots__ = ("id", "kind", "name", "source", "state", "pinned", "size_bytes", "sha256", "expected_sha256", "fetched_bytes", "hits", "error", "warm_seconds", "create_time", "finish_time", "last_use_time", "image_warmth", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHA256_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WARM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_TIME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WARMTH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: CacheItemKind
    name: str
    source: str
    state: CacheItemState
    pinned: bool
    size_bytes: int
    sha256: str
    expected_sha256: str
    fetched_bytes: int
    hits: int
    error: str
    warm_seconds: float
    create_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    last_use_time: _timestamp_pb2.Timestamp
    image_warmth: ImageWarmth
    options: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[CacheItemKind, str]] = ..., name: _Optional[str] = ..., source: _Optional[str] = ..., state: _Optional[_Union[CacheItemState, str]] = ..., pinned: _Optional[bool] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., expected_sha256: _Optional[str] = ..., fetched_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., error: _Optional[str] = ..., warm_seconds: _Optional[float] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_use_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., image_warmth: _Optional[_Union[ImageWarmth, _Mapping]] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CacheUsage(_message.Message):
    __slots__ = ("used_bytes", "reserved_bytes", "pinned_bytes", "capacity_bytes", "budget_bytes", "volume_bytes")
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    VOLUME_BYTES_FIELD_NUMBER: _ClassVar[int]
    used_bytes: int
    reserved_bytes: int
    pinned_bytes: int
    capacity_bytes: int
    budget_bytes: int
    volume_bytes: int
    def __init__(self, used_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., pinned_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., volume_bytes: _Optional[int] = ...) -> None: ...

class CacheInventory(_message.Message):
    __slots__ = ("usage", "items")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    usage: CacheUsage
    items: _containers.RepeatedCompositeFieldContainer[CacheItem]
    def __init__(self, usage: _Optional[_Union[CacheUsage, _Mapping]] = ..., items: _Optional[_Iterable[_Union[CacheItem, _Mapping]]] = ...) -> None: ...
