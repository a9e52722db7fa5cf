from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "driver_version", "gpus")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    driver_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    def __init__(self, name: _Optional[str] = ..., driver_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "pci_bus_id", "memory_total_bytes", "mig_capable", "mig_mode", "instances", "processes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIG_CAPABLE_FIELD_NUMBER: _ClassVar[int]
    MIG_MODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    mig_capable: bool
    mig_mode: MigMode
    instances: _containers.RepeatedCompositeFieldContainer[GpuInstance]
    processes: _containers.RepeatedCompositeFieldContainer[Process]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., mig_capable: _Optional[bool] = ..., mig_mode: _Optional[_Union[MigMode, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[GpuInstance, _Mapping]]] = ..., processes: _Optional[_Iterable[_Union[Process, _Mapping]]] = ...) -> None: ...

class MigMode(_message.Message):
    __slots__ = ("current", "pending")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    current: bool
    pending: bool
    def __init__(self, current: _Optional[bool] = ..., pending: _Optional[bool] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("start", "size")
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    start: int
    size: int
    def __init__(self, start: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class GpuInstance(_message.Message):
    __slots__ = ("id", "profile_id", "profile_name", "placement", "compute_instances")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_NAME_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    id: int
    profile_id: int
    profile_name: str
    placement: Placement
    compute_instances: _containers.RepeatedCompositeFieldContainer[ComputeInstance]
    def __init__(self, id: _Optional[int] = ..., profile_id: _Optional[int] = ..., profile_name: _Optional[str] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., compute_instances: _Optional[_Iterable[_Union[ComputeInstance, _Mapping]]] = ...) -> None: ...

class ComputeInstance(_message.Message):
    __slots__ = ("id", "profile_id", "placement", "uuid")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    id: int
    profile_id: int
    placement: Placement
    uuid: str
    def __init__(self, id: _Optional[int] = ..., profile_id: _Optional[int] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., uuid: _Optional[str] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("pid", "used_memory_bytes", "gpu_instance_id", "compute_instance_id")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory_bytes: int
    gpu_instance_id: int
    compute_instance_id: int
    def __init__(self, pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ..., gpu_instance_id: _Optional[int] = ..., compute_instance_id: _Optional[int] = ...) -> None: ...
