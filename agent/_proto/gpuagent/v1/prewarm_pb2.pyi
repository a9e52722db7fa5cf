from agent._proto.gpuagent.v1 import cache_pb2 as _cache_pb2
from agent._proto.gpuagent.v1 import operations_pb2 as _operations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImagePullPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_PULL_POLICY_UNSPECIFIED: _ClassVar[ImagePullPolicy]
    IMAGE_PULL_POLICY_IF_NOT_PRESENT: _ClassVar[ImagePullPolicy]
    IMAGE_PULL_POLICY_ALWAYS: _ClassVar[ImagePullPolicy]
IMAGE_PULL_POLICY_UNSPECIFIED: ImagePullPolicy
IMAGE_PULL_POLICY_IF_NOT_PRESENT: ImagePullPolicy
IMAGE_PULL_POLICY_ALWAYS: ImagePullPolicy

class FileTarget(_message.Message):
    __slots__ = ("url", "name", "sha256", "pin", "header_files")
    class HeaderFilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    HEADER_FILES_FIELD_NUMBER: _ClassVar[int]
    url: str
    name: str
    sha256: str
    pin: bool
    header_files: _containers.ScalarMap[str, str]
    def __init__(self, url: _Optional[str] = ..., name: _Optional[str] = ..., sha256: _Optional[str] = ..., pin: _Optional[bool] = ..., header_files: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ImageTarget(_message.Message):
    __slots__ = ("ref", "name", "runtime_handler", "pin", "pull_policy", "repull_hours")
    REF_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    PULL_POLICY_FIELD_NUMBER: _ClassVar[int]
    REPULL_HOURS_FIELD_NUMBER: _ClassVar[int]
    ref: str
    name: str
    runtime_handler: str
    pin: bool
    pull_policy: ImagePullPolicy
    repull_hours: float
    def __init__(self, ref: _Optional[str] = ..., name: _Optional[str] = ..., runtime_handler: _Optional[str] = ..., pin: _Optional[bool] = ..., pull_policy: _Optional[_Union[ImagePullPolicy, str]] = ..., repull_hours: _Optional[float] = ...) -> None: ...

class ModelTarget(_message.Message):
    __slots__ = ("repo", "revision", "endpoint", "include", "name", "pin", "header_files")
    class HeaderFilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    HEADER_FILES_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revision: str
    endpoint: str
    include: _containers.RepeatedScalarFieldContainer[str]
    name: str
    pin: bool
    header_files: _containers.ScalarMap[str, str]
    def __init__(self, repo: _Optional[str] = ..., revision: _Optional[str] = ..., endpoint: _Optional[str] = ..., include: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., pin: _Optional[bool] = ..., header_files: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PrewarmTarget(_message.Message):
    __slots__ = ("file", "image", "model")
    FILE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    file: FileTarget
    image: ImageTarget
    model: ModelTarget
    def __init__(self, file: _Optional[_Union[FileTarget, _Mapping]] = ..., image: _Optional[_Union[ImageTarget, _Mapping]] = ..., model: _Optional[_Union[ModelTarget, _Mapping]] = ...) -> None: ...

class SubmitPrewarmRequest(_message.Message):
    __slots__ = ("targets", "request_id")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[PrewarmTarget]
    request_id: str
    def __init__(self, targets: _Optional[_Iterable[_Union[PrewarmTarget, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitPrewarmResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: _operations_pb2.Operation
    def __init__(self, operation: _Optional[_Union[_operations_pb2.Operation, _Mapping]] = ...) -> None: ...

class ListPrewarmItemsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPrewarmItemsResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_cache_pb2.CacheItem]
    def __init__(self, items: _Optional[_Iterable[_Union[_cache_pb2.CacheItem, _Mapping]]] = ...) -> None: ...

class CancelPrewarmItemRequest(_message.Message):
    __slots__ = ("item", "request_id")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    item: str
    request_id: str
    def __init__(self, item: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelPrewarmItemResponse(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _cache_pb2.CacheItem
    def __init__(self, item: _Optional[_Union[_cache_pb2.CacheItem, _Mapping]] = ...) -> None: ...

class ListCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCacheResponse(_message.Message):
    __slots__ = ("cache",)
    CACHE_FIELD_NUMBER: _ClassVar[int]
    cache: _cache_pb2.CacheInventory
    def __init__(self, cache: _Optional[_Union[_cache_pb2.CacheInventory, _Mapping]] = ...) -> None: ...

class EvictCacheItemRequest(_message.Message):
    __slots__ = ("item", "request_id")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    item: str
    request_id: str
    def __init__(self, item: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class EvictCacheItemResponse(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _cache_pb2.CacheItem
    def __init__(self, item: _Optional[_Union[_cache_pb2.CacheItem, _Mapping]] = ...) -> None: ...

class DeletePrewarmItemRequest(_message.Message):
    __slots__ = ("item", "request_id")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    item: str
    request_id: str
    def __init__(self, item: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeletePrewarmItemResponse(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _cache_pb2.CacheItem
    def __init__(self, item: _Optional[_Union[_cache_pb2.CacheItem, _Mapping]] = ...) -> None: ...

class PinCacheItemRequest(_message.Message):
    __slots__ = ("item", "pinned", "request_id")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    item: str
    pinned: bool
    request_id: str
    def __init__(self, item: _Optional[str] = ..., pinned: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class PinCacheItemResponse(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _cache_pb2.CacheItem
    def __init__(self, item: _Optional[_Union[_cache_pb2.CacheItem, _Mapping]] = ...) -> None: ...
