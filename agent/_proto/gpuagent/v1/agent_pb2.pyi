import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from agent._proto.gpuagent.v1 import cache_pb2 as _cache_pb2
from agent._proto.gpuagent.v1 import sharing_pb2 as _sharing_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DriverState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRIVER_STATE_UNSPECIFIED: _ClassVar[DriverState]
    DRIVER_STATE_ATTACHED: _ClassVar[DriverState]
    DRIVER_STATE_NOT_READY: _ClassVar[DriverState]

class AllocationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_MODE_UNSPECIFIED: _ClassVar[AllocationMode]
    ALLOCATION_MODE_DEVICE_PLUGIN: _ClassVar[AllocationMode]
    ALLOCATION_MODE_DRA: _ClassVar[AllocationMode]
    ALLOCATION_MODE_DRA_DYNAMIC_MIG: _ClassVar[AllocationMode]
    ALLOCATION_MODE_NONE: _ClassVar[AllocationMode]

class HealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_STATE_UNSPECIFIED: _ClassVar[HealthState]
    HEALTH_STATE_HEALTHY: _ClassVar[HealthState]
    HEALTH_STATE_DEGRADED: _ClassVar[HealthState]
    HEALTH_STATE_FAILED: _ClassVar[HealthState]

class GpuHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_UNSPECIFIED: _ClassVar[GpuHealth]
    GPU_HEALTH_OK: _ClassVar[GpuHealth]
    GPU_HEALTH_LOST: _ClassVar[GpuHealth]

class DoctorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOCTOR_STATE_UNSPECIFIED: _ClassVar[DoctorState]
    DOCTOR_STATE_OK: _ClassVar[DoctorState]
    DOCTOR_STATE_DEGRADED: _ClassVar[DoctorState]
    DOCTOR_STATE_FAILED: _ClassVar[DoctorState]
DRIVER_STATE_UNSPECIFIED: DriverState
DRIVER_STATE_ATTACHED: DriverState
DRIVER_STATE_NOT_READY: DriverState
ALLOCATION_MODE_UNSPECIFIED: AllocationMode
ALLOCATION_MODE_DEVICE_PLUGIN: AllocationMode
ALLOCATION_MODE_DRA: AllocationMode
ALLOCATION_MODE_DRA_DYNAMIC_MIG: AllocationMode
ALLOCATION_MODE_NONE: AllocationMode
HEALTH_STATE_UNSPECIFIED: HealthState
HEALTH_STATE_HEALTHY: HealthState
HEALTH_STATE_DEGRADED: HealthState
HEALTH_STATE_FAILED: HealthState
GPU_HEALTH_UNSPECIFIED: GpuHealth
GPU_HEALTH_OK: GpuHealth
GPU_HEALTH_LOST: GpuHealth
DOCTOR_STATE_UNSPECIFIED: DoctorState
DOCTOR_STATE_OK: DoctorState
DOCTOR_STATE_DEGRADED: DoctorState
DOCTOR_STATE_FAILED: DoctorState

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "driver_version", "gpus", "sharing", "cache", "health", "observe_time", "simulated_preset", "agent_version", "processes_hidden", "allocation", "driver", "sharing_pickup")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_PRESET_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    SHARING_PICKUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    driver_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    sharing: _sharing_pb2.SharingConfig
    cache: _cache_pb2.CacheInventory
    health: NodeHealth
    observe_time: _timestamp_pb2.Timestamp
    simulated_preset: str
    agent_version: str
    processes_hidden: bool
    allocation: Allocation
    driver: Driver
    sharing_pickup: str
    def __init__(self, name: _Optional[str] = ..., driver_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., sharing: _Optional[_Union[_sharing_pb2.SharingConfig, _Mapping]] = ..., cache: _Optional[_Union[_cache_pb2.CacheInventory, _Mapping]] = ..., health: _Optional[_Union[NodeHealth, _Mapping]] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., simulated_preset: _Optional[str] = ..., agent_version: _Optional[str] = ..., processes_hidden: _Optional[bool] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ..., driver: _Optional[_Union[Driver, _Mapping]] = ..., sharing_pickup: _Optional[str] = ...) -> None: ...

class Driver(_message.Message):
    __slots__ = ("state", "cause", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: DriverState
    cause: str
    reason: str
    def __init__(self, state: _Optional[_Union[DriverState, str]] = ..., cause: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("mode", "evidence", "dra_driver", "mig_refusal")
    MODE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRA_DRIVER_FIELD_NUMBER: _ClassVar[int]
    MIG_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    mode: AllocationMode
    evidence: str
    dra_driver: str
    mig_refusal: str
    def __init__(self, mode: _Optional[_Union[AllocationMode, str]] = ..., evidence: _Optional[str] = ..., dra_driver: _Optional[str] = ..., mig_refusal: _Optional[str] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "pci_bus_id", "memory_total_bytes", "mig_capable", "mig_mode", "instances", "processes", "pci_device_id", "mig_profiles", "health", "idle_seconds", "health_detail", "pci_subsystem_id", "condition", "unread", "never_read")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIG_CAPABLE_FIELD_NUMBER: _ClassVar[int]
    MIG_MODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PCI_DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    PCI_SUBSYSTEM_ID_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    UNREAD_FIELD_NUMBER: _ClassVar[int]
    NEVER_READ_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    mig_capable: bool
    mig_mode: MigMode
    instances: _containers.RepeatedCompositeFieldContainer[GpuInstance]
    processes: _containers.RepeatedCompositeFieldContainer[Process]
    pci_device_id: int
    mig_profiles: _containers.RepeatedCompositeFieldContainer[MigProfile]
    health: GpuHealth
    idle_seconds: float
    health_detail: str
    pci_subsystem_id: int
    condition: HealthMark
    unread: str
    never_read: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., mig_capable: _Optional[bool] = ..., mig_mode: _Optional[_Union[MigMode, _Mapping]] = ..., instances: _Optional[_Iterable[_Union[GpuInstance, _Mapping]]] = ..., processes: _Optional[_Iterable[_Union[Process, _Mapping]]] = ..., pci_device_id: _Optional[int] = ..., mig_profiles: _Optional[_Iterable[_Union[MigProfile, _Mapping]]] = ..., health: _Optional[_Union[GpuHealth, str]] = ..., idle_seconds: _Optional[float] = ..., health_detail: _Optional[str] = ..., pci_subsystem_id: _Optional[int] = ..., condition: _Optional[_Union[HealthMark, _Mapping]] = ..., unread: _Optional[str] = ..., never_read: _Optional[bool] = ...) -> None: ...

class HealthMark(_message.Message):
    __slots__ = ("state", "reason", "since", "action", "pods")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    state: HealthState
    reason: str
    since: _timestamp_pb2.Timestamp
    action: str
    pods: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[HealthState, str]] = ..., reason: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[str] = ..., pods: _Optional[_Iterable[str]] = ...) -> None: ...

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

class MigProfile(_message.Message):
    __slots__ = ("id", "name", "slice_count", "memory_slices", "instance_count", "memory_mb", "placements", "constant")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SLICES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    slice_count: int
    memory_slices: int
    instance_count: int
    memory_mb: int
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    constant: int
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., slice_count: _Optional[int] = ..., memory_slices: _Optional[int] = ..., instance_count: _Optional[int] = ..., memory_mb: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., constant: _Optional[int] = ...) -> None: ...

class GpuInstance(_message.Message):
    __slots__ = ("id", "profile_id", "profile_name", "placement", "compute_instances", "condition")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_NAME_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    id: int
    profile_id: int
    profile_name: str
    placement: Placement
    compute_instances: _containers.RepeatedCompositeFieldContainer[ComputeInstance]
    condition: HealthMark
    def __init__(self, id: _Optional[int] = ..., profile_id: _Optional[int] = ..., profile_name: _Optional[str] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., compute_instances: _Optional[_Iterable[_Union[ComputeInstance, _Mapping]]] = ..., condition: _Optional[_Union[HealthMark, _Mapping]] = ...) -> None: ...

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

class NodeHealth(_message.Message):
    __slots__ = ("healthy", "components")
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    healthy: bool
    components: _containers.RepeatedCompositeFieldContainer[ComponentHealth]
    def __init__(self, healthy: _Optional[bool] = ..., components: _Optional[_Iterable[_Union[ComponentHealth, _Mapping]]] = ...) -> None: ...

class ComponentHealth(_message.Message):
    __slots__ = ("name", "healthy", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    healthy: bool
    detail: str
    def __init__(self, name: _Optional[str] = ..., healthy: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class DoctorRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DoctorResponse(_message.Message):
    __slots__ = ("node", "checks")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    node: str
    checks: _containers.RepeatedCompositeFieldContainer[DoctorCheck]
    def __init__(self, node: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[DoctorCheck, _Mapping]]] = ...) -> None: ...

class DoctorCheck(_message.Message):
    __slots__ = ("duty", "name", "state", "evidence", "fix")
    DUTY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    FIX_FIELD_NUMBER: _ClassVar[int]
    duty: str
    name: str
    state: DoctorState
    evidence: str
    fix: str
    def __init__(self, duty: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[DoctorState, str]] = ..., evidence: _Optional[str] = ..., fix: _Optional[str] = ...) -> None: ...
