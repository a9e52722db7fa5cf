"""GPU Performance Monitoring (Hopper and later; telemetry.md §3).

A sample snapshots an entity's activity counters (``activity.py``) at a monotonic instant;
``nvmlGpmMetricsGet`` averages each rate between two samples of the same entity, so a workload
held constant between the samples comes back exactly: ratios as percent (0-100), traffic in
MiB/s. Entities: the whole GPU (``nvmlGpmSampleGet`` on a GPU handle), a GPU instance
(``nvmlGpmMigSampleGet``) and a MIG device (``nvmlGpmSampleGet`` on its handle; a compute
instance reports its GI's activity, since workloads are injected per GI).

Not modelled, reported per metric as NOT_SUPPORTED: integer and per-type tensor pipes, C2C,
context-switch, cache and raw-counter metrics. Media engines exist and are idle (0 %). PCIe and
NVLink are GPU-level only, so MIG samples report them NOT_SUPPORTED (as DCGM, telemetry.md §2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.sim.abi import decode, fail, handle_slot, store_handle, symbol, target, to_int
from agent.gpu.sim.handles import Handle, Kind
from agent.gpu.sim.layout import gi_spec, whole_gpu_profile
from agent.gpu.sim.memory import Sample
from agent.gpu.sim.state import Activity

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver

MIB = float(1 << 20)

_RATIOS = {
    # No GR-engine field is injectable: graphics/compute engine activity is taken as SM activity.
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64_active",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32_active",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16_active",
}
_TRAFFIC = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_bytes_per_s",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_bytes_per_s",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_bytes_per_s",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_bytes_per_s",
}
_LINK_FIRST = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # then L0_TX, L1_RX, ... L17_TX
_LINK_LAST = pynvml.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC
_ENGINES = (  # (first metric id, how many ids, which engine count bounds them)
    (pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL, 8, "decoders"),
    (pynvml.NVML_GPM_METRIC_NVJPG_0_UTIL, 8, "jpegs"),
    (pynvml.NVML_GPM_METRIC_NVOFA_0_UTIL, 2, "ofas"),
)
_NAMES = {
    value: name.removeprefix("NVML_GPM_METRIC_")
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_GPM_METRIC_") and name != "NVML_GPM_METRIC_MAX"
}


def _sample_id(drv: SimDriver, value: Any) -> int:
    h = decode(value)
    if h.kind != Kind.GPM_SAMPLE or h.serial not in drv.samples:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return h.serial


def _copy(a: Activity) -> Activity:
    return Activity(dict(a.rates), dict(a.totals), a.since)


@symbol("nvmlGpmQueryDeviceSupport")
def query_device_support(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.device(handle)
    support = target(ref)
    if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
        raise fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    support.isSupportedDevice = int(t.model.gpm_supported)


@symbol("nvmlGpmSampleAlloc")
def sample_alloc(drv: SimDriver, ref: Any) -> None:
    slot = handle_slot(ref)
    with drv.lock:
        sample_id = drv.new_local_id()
        drv.samples[sample_id] = None
    store_handle(slot, Handle(Kind.GPM_SAMPLE, 0, sample_id))


@symbol("nvmlGpmSampleFree")
def sample_free(drv: SimDriver, value: Any) -> None:
    sample_id = _sample_id(drv, value)
    with drv.lock:
        drv.samples.pop(sample_id, None)


@symbol("nvmlGpmSampleGet")
def sample_get(drv: SimDriver, handle: Any, value: Any) -> None:
    t = drv.device(handle)
    if not t.model.gpm_supported:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample_id = _sample_id(drv, value)
    now = drv.now()
    if t.gi is not None and t.ci is not None:
        sample = Sample(
            ("ci", t.gpu.index, t.ci.serial),
            True,
            now,
            _copy(t.gi.activity),
            gi_spec(t.model, t.gi),
            0,
        )
    else:
        sample = Sample(
            ("gpu", t.gpu.index, t.node.boot_id),
            False,
            now,
            _copy(t.gpu.activity),
            whole_gpu_profile(t.model),
            t.model.nvlink_links,
        )
    drv.samples[sample_id] = sample


@symbol("nvmlGpmMigSampleGet")
def mig_sample_get(drv: SimDriver, handle: Any, gi_id: Any, value: Any) -> None:
    t = drv.device(handle)  # DCGM passes the parent; its test recorder passes the MIG handle
    if not t.model.gpm_supported or not t.gpu.mig_current:
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    sample_id = _sample_id(drv, value)
    gi = t.gpu.gpu_instance(to_int(gi_id))
    if gi is None or (t.gi is not None and t.gi.id != gi.id):
        raise fail(pynvml.NVML_ERROR_NOT_FOUND)
    sample = Sample(
        ("gi", t.gpu.index, gi.serial),
        True,
        drv.now(),
        _copy(gi.activity),
        gi_spec(t.model, gi),
        0,
    )
    drv.samples[sample_id] = sample


@symbol("nvmlGpmMetricsGet")
def metrics_get(drv: SimDriver, ref: Any) -> None:
    request = target(ref)
    if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
        raise fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if request.numMetrics > pynvml.NVML_GPM_METRIC_MAX:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    first = drv.samples.get(_sample_id(drv, request.sample1))
    second = drv.samples.get(_sample_id(drv, request.sample2))
    if first is None or second is None or first.entity != second.entity:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if second.taken <= first.taken:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    for i in range(request.numMetrics):
        metric = request.metrics[i]
        code, value = _metric(metric.metricId, first, second)
        metric.nvmlReturn = code
        metric.value = value
        name = _NAMES.get(metric.metricId, "")
        metric.metricInfo.shortName = name.encode()
        metric.metricInfo.longName = name.replace("_", " ").lower().encode()
        metric.metricInfo.unit = (b"MiB/s" if name.endswith("_PER_SEC") else b"%") if name else b""


def _average(name: str, first: Sample, second: Sample) -> float:
    a, b = first.counters, second.counters
    if a.since == b.since and a.rates == b.rates:
        return a.rates.get(name, 0.0)  # one constant workload across the window: exact
    return (second.total(name) - first.total(name)) / (second.taken - first.taken)


def _metric(metric_id: int, first: Sample, second: Sample) -> tuple[int, float]:
    if metric_id in _RATIOS:
        # Counters have finite resolution; rounding keeps 30 % from coming back as 30.000...04.
        return pynvml.NVML_SUCCESS, round(100.0 * _average(_RATIOS[metric_id], first, second), 9)
    if metric_id in _TRAFFIC:
        if first.per_instance:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return pynvml.NVML_SUCCESS, _average(_TRAFFIC[metric_id], first, second) / MIB
    if _LINK_FIRST <= metric_id <= _LINK_LAST:
        link, tx = divmod(metric_id - _LINK_FIRST, 2)
        if first.per_instance or link >= first.nvlink_links:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        name = "nvlink_tx_bytes_per_s" if tx else "nvlink_rx_bytes_per_s"
        per_link = _average(name, first, second) / first.nvlink_links
        return pynvml.NVML_SUCCESS, per_link / MIB
    for base, span, engine in _ENGINES:
        if base <= metric_id < base + span:
            present = metric_id - base < getattr(first.engines, engine)
            code = pynvml.NVML_SUCCESS if present else pynvml.NVML_ERROR_NOT_SUPPORTED
            return code, 0.0  # no media workload is injectable: engines idle
    if 0 < metric_id < pynvml.NVML_GPM_METRIC_MAX:
        return pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
    return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0
