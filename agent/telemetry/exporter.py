"""Renders the latest snapshot as Prometheus text or OpenMetrics, chosen by the Accept header.

A scrape never collects: it turns the published :class:`Snapshot` into metric families (the
client library's ``Metric``) and encodes them (``encode.py``, byte-identical to the library's
encoders). The body is cached per snapshot and format and re-encoded by the sampler thread when a
snapshot is published, so a scrape costs a dictionary lookup.

DCGM names cannot take OpenMetrics' ``_total`` suffix without stopping being DCGM names, so under
``dcgm`` naming the counter fields are typed ``unknown`` in OpenMetrics and ``counter`` in the
classic text format, exactly as dcgm-exporter types them there (``encode.ClassicCounter``).
Native names are real counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from agent.http import Request, Response
from agent.telemetry.encode import ClassicCounter, encode
from agent.telemetry.naming import DcgmNaming, Labels, LabelValue, Naming, NativeNaming
from agent.telemetry.snapshot import EntitySample, Snapshot
from agent.telemetry.stats import Histogram, TelemetryStats
from agent.telemetry.xid import WINDOW_S as XID_WINDOW_S
from agent.telemetry.xid import xid_message
from dcgm.counters import Counter, CounterSet
from dcgm.fields import (
    BY_ID,
    CLOCK_EVENT_WINDOW_S,
    P2P_STATUS_NAMES,
    ClockEventWindow,
    Field,
    GpuStrings,
    Info,
    Kind,
    Level,
    P2pStatus,
    XidEvents,
    XidWindow,
)

__all__ = ["MetricsExporter", "families"]

_XID_FIELD = 230
_Row = tuple[EntitySample, Labels]
#: Formats scraped within this many seconds are encoded ahead of the next scrape.
_PRERENDER_FOR_S = 600.0


def families(
    snapshot: Snapshot | None,
    counters: CounterSet,
    native: bool,
    stats: TelemetryStats | None = None,
    devices: str = "f",
) -> list[Metric]:
    """Every metric family of one scrape, in a stable order. Pure apart from reading ``stats``.

    ``devices`` is dcgm-exporter's ``--devices`` choice for the fields measured per GPU instance
    (framebuffer, DCP): ``f`` (flex) renders them on a GPU's instances when it has MIG
    instances and on the GPU otherwise; ``g`` on whole GPUs only. GPU-level fields (power,
    temperature, PCIe...) are on the GPU row in both."""
    out: list[Metric] = []
    if snapshot is not None:
        naming: Naming = (
            NativeNaming()
            if native
            else DcgmNaming(snapshot.hostname, _label_fields(snapshot, counters))
        )
        # One label dict per entity, shared by all its series (the encoder escapes it once).
        rows = [(s, naming.entity(s.entity, s.pod, s.claim, s.pod_uid)) for s in snapshot.entities]
        if native:
            out.append(_info(snapshot, counters))
        for counter in counters.values:
            out.extend(_field_families(counter, native, _rows_for(counter.field, rows, devices)))
            if isinstance(counter.field.source, XidWindow):
                out.extend(_xid_window(counter, snapshot, naming, native))
            if isinstance(counter.field.source, ClockEventWindow):
                out.extend(_clock_events(counter, snapshot, naming, native))
            if isinstance(counter.field.source, P2pStatus):
                out.extend(_p2p(counter, snapshot, naming, native))
        out.extend(_agent_families(snapshot, naming, rows))
    out.append(_unserved(counters))
    if stats is not None:
        out.extend(_stats_families(stats))
    return [f for f in out if f.samples]


class MetricsExporter:
    """The /metrics handler: ``latest`` returns the newest snapshot (or None before the first).

    Bodies are cached per snapshot and format. :meth:`prerender`, called by the sampler thread
    when it publishes, encodes the new snapshot in every format scraped lately, so a scrape is a
    cache hit and costs no encoding on the event loop.
    """

    def __init__(
        self,
        counters: CounterSet,
        metric_names: str,
        latest: Callable[[], Snapshot | None],
        stats: TelemetryStats,
        clock: Callable[[], float] = time.perf_counter,
        devices: str = "f",
    ) -> None:
        self._counters = counters
        self._devices = devices
        self._native = metric_names == "native"
        self._latest = latest
        self._stats = stats
        self._clock = clock
        self._lock = threading.Lock()
        #: openmetrics? -> (snapshot it encodes, body)
        self._cache: dict[bool, tuple[Snapshot | None, bytes]] = {}
        #: openmetrics? -> when it was last asked for
        self._asked: dict[bool, float] = {}
        #: Other services' collectors (prewarm inventory, MIG config state): small, rendered
        #: fresh on every scrape from their own in-memory state.
        self._extra: list[Collector] = []

    def add_collector(self, collector: Collector) -> None:
        self._extra.append(collector)

    def render(self, accept: str) -> tuple[bytes, str]:
        """(body, content type) for an Accept header."""
        _, content_type = choose_encoder(accept)
        openmetrics = content_type.startswith("application/openmetrics-text")
        snapshot = self._latest()
        with self._lock:
            self._asked[openmetrics] = self._clock()
            cached = self._cache.get(openmetrics)
        if cached is not None and cached[0] is snapshot and snapshot is not None:
            body = cached[1]
        else:
            body = self._encode(snapshot, openmetrics)
        return self._with_extra(body, openmetrics), content_type

    def _with_extra(self, body: bytes, openmetrics: bool) -> bytes:
        if not self._extra:
            return body
        extra = [m for c in self._extra for m in c.collect() if m.samples]
        if openmetrics:  # one "# EOF", at the very end
            body = body.removesuffix(b"# EOF\n")
        return body + encode(extra, openmetrics)

    def prerender(self, snapshot: Snapshot) -> None:
        """Encode ``snapshot`` in the formats scraped within the last ``_PRERENDER_FOR_S``."""
        now = self._clock()
        with self._lock:
            formats = [f for f, at in self._asked.items() if now - at < _PRERENDER_FOR_S]
        for openmetrics in formats:
            self._encode(snapshot, openmetrics)

    def _encode(self, snapshot: Snapshot | None, openmetrics: bool) -> bytes:
        rendered = families(snapshot, self._counters, self._native, self._stats, self._devices)
        body = encode(rendered, openmetrics)
        with self._lock:
            self._cache[openmetrics] = (snapshot, body)
        return body

    async def handle(self, request: Request) -> Response:
        started = self._clock()
        body, content_type = self.render(request.headers.get("accept", ""))
        self._stats.observe_scrape(self._clock() - started)
        return Response(200, body, content_type)


def _label_fields(snapshot: Snapshot, counters: CounterSet) -> list[tuple[str, LabelValue]]:
    """The CSV's label-type fields in CSV order: (label name, node-wide text or per-GPU key)."""
    out: list[tuple[str, LabelValue]] = []
    for counter in counters.labels:
        source = counter.field.source
        if isinstance(source, GpuStrings):
            out.append((counter.name, source.key))
        else:
            value = _info_value(snapshot, counter)
            if value:
                out.append((counter.name, value))
    return out


def _info_value(snapshot: Snapshot, counter: Counter) -> str:
    source = counter.field.source
    assert isinstance(source, Info)
    return {"driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version}[
        source.key
    ]


def _info(snapshot: Snapshot, counters: CounterSet) -> Metric:
    metric = Metric("gpu_agent_gpu", "Identity of each GPU; value 1.", "info")
    for status in snapshot.gpus:
        versions = {}
        for c in counters.labels:
            source = c.field.source
            value = (
                status.gpu.string(source.key)
                if isinstance(source, GpuStrings)
                else _info_value(snapshot, c)
            )
            if value is not None:
                versions[c.field.native] = value
        labels = NativeNaming.info(status.gpu, snapshot.hostname, versions)
        metric.samples.append(Sample("gpu_agent_gpu_info", labels, 1.0))
    return metric


def _rows_for(field: Field, rows: list[_Row], devices: str) -> list[_Row]:
    """The entities a field is rendered on (see ``families``); one row per quantity, so a sum
    over a GPU's rows is the GPU's figure."""
    if field.level is Level.GPU:
        return rows
    if devices == "g":
        return [r for r in rows if r[0].entity.instance is None]
    partitioned = {s.entity.gpu.index for s, _ in rows if s.entity.instance is not None}
    return [
        r
        for r in rows
        if r[0].entity.instance is not None or r[0].entity.gpu.index not in partitioned
    ]


def _field_families(counter: Counter, native: bool, rows: list[_Row]) -> Iterator[Metric]:
    field = counter.field
    if isinstance(field.source, XidEvents):
        if not native:
            yield _last_xid(counter, rows)
        return  # occurrences are rendered by _agent_families for both schemes
    if isinstance(field.source, XidWindow | ClockEventWindow | P2pStatus):
        return  # rendered from the snapshot's window counts (_xid_window, _clock_events)
    if native:
        name, typ = field.native, field.kind.value
        sample_name = name + "_total" if field.kind is Kind.COUNTER else name
        metric = Metric(name, f"{field.help} DCGM: {field.name}.", typ)
        for sample, labels in rows:
            value = sample.values.get(field.id)
            if value is not None:
                metric.samples.append(Sample(sample_name, labels, field.to_base(value)))
        yield metric
        return
    name = counter.name  # the DCGM name, or the 1.x name the CSV row used
    metric = (  # typed as the row declares it, as dcgm-exporter does
        ClassicCounter(name, counter.help)
        if counter.exported_kind is Kind.COUNTER
        else Metric(name, counter.help, "gauge")
    )
    for sample, labels in rows:
        value = sample.values.get(field.id)
        if value is not None:
            metric.samples.append(Sample(name, labels, value))
    yield metric


def _xid_window(
    counter: Counter, snapshot: Snapshot, naming: Naming, native: bool
) -> Iterator[Metric]:
    """dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: XIDs per GPU within the window."""
    name = counter.field.native if native else counter.name
    metric = Metric(name, counter.help, "gauge")
    window = {"window_size_in_ms": str(int(XID_WINDOW_S * 1000))}
    for x in snapshot.xid_recent:
        labels = {**naming.gpu(x.entity.gpu), "xid": str(x.xid), **window}
        metric.samples.append(Sample(name, labels, float(x.count)))
    yield metric


def _clock_events(
    counter: Counter, snapshot: Snapshot, naming: Naming, native: bool
) -> Iterator[Metric]:
    """dcgm-exporter's DCGM_EXP_CLOCK_EVENTS_COUNT: per GPU and reason, samples in the window."""
    name = counter.field.native if native else counter.name
    metric = Metric(name, counter.help, "gauge")
    window = {"window_size_in_ms": str(int(CLOCK_EVENT_WINDOW_S * 1000))}
    for c in snapshot.clock_events:
        labels = {**naming.gpu(c.gpu), "clock_event": c.reason, **window}
        metric.samples.append(Sample(name, labels, float(c.count)))
    yield metric


def _p2p(counter: Counter, snapshot: Snapshot, naming: Naming, native: bool) -> Iterator[Metric]:
    """dcgm-exporter's DCGM_EXP_P2P_STATUS: per GPU and peer, the status code with its name."""
    name = counter.field.native if native else counter.name
    metric = Metric(name, counter.help, "gauge")
    for link in snapshot.p2p:
        status = P2P_STATUS_NAMES.get(link.status, "Unknown")
        labels = {**naming.gpu(link.gpu), "peer_gpu": str(link.peer), "link_status": status}
        metric.samples.append(Sample(name, labels, float(link.status)))
    yield metric


def _last_xid(counter: Counter, rows: list[_Row]) -> Metric:
    """dcgm-exporter's last-XID gauge, with its ``err_code``/``err_msg`` labels."""
    metric = Metric(counter.name, counter.help, "gauge")
    for sample, entity_labels in rows:
        value = sample.values.get(_XID_FIELD)
        if value is not None:
            code = int(value)
            labels = {
                **entity_labels,
                "err_code": str(code),
                "err_msg": xid_message(code),
            }
            metric.samples.append(Sample(counter.name, labels, value))
    return metric


def _agent_families(snapshot: Snapshot, naming: Naming, rows: list[_Row]) -> Iterator[Metric]:
    up = Metric("gpu_agent_gpu_up", "1 when the GPU answers NVML, 0 when it is lost.", "gauge")
    for status in snapshot.gpus:
        up.samples.append(Sample(up.name, naming.gpu(status.gpu), 1.0 if status.up else 0.0))
    yield up

    xids = Metric("gpu_agent_xid_errors", "XID errors seen since the agent started.", "counter")
    for x in snapshot.xids:
        labels = {**naming.entity(x.entity, None), "xid": str(x.xid)}
        xids.samples.append(Sample("gpu_agent_xid_errors_total", labels, float(x.count)))
    yield xids

    idle = Metric(
        "gpu_agent_idle_seconds",
        "Seconds since utilisation was last above the idle threshold (counted from agent start).",
        "gauge",
    )
    for sample, labels in rows:
        if sample.idle_seconds is not None:
            idle.samples.append(Sample(idle.name, labels, sample.idle_seconds))
    yield idle

    yield from _pod_families(snapshot, naming)

    supported = Metric(
        "gpu_agent_field_supported", "1 when a selected DCGM field can be read on the GPU.", "gauge"
    )
    for s in snapshot.support:
        labels = {"field": BY_ID[s.field_id].name, "gpu": str(s.gpu.index)}
        supported.samples.append(Sample(supported.name, labels, 1.0 if s.supported else 0.0))
    yield supported

    stamp = Metric(
        "gpu_agent_snapshot_timestamp_seconds",
        "Unix time the exported values were collected; time() minus it is their age.",
        "gauge",
    )
    stamp.samples.append(Sample(stamp.name, {}, snapshot.taken_at))
    yield stamp


def _unserved(counters: CounterSet) -> Metric:
    metric = Metric(
        "gpu_agent_dcgm_field_unserved",
        "1 for each selected DCGM field the agent does not serve (no series), with the reason.",
        "gauge",
    )
    for u in counters.unserved:
        metric.samples.append(Sample(metric.name, {"field": u.name, "reason": u.reason}, 1.0))
    return metric


def _pod_families(snapshot: Snapshot, naming: Naming) -> Iterator[Metric]:
    memory = Metric(
        "gpu_agent_pod_memory_used_bytes",
        "GPU memory used by a container's processes on the GPU or instance.",
        "gauge",
    )
    util = Metric(
        "gpu_agent_pod_sm_utilization_ratio",
        "SM utilisation of a container's processes on the GPU (0-1; not available on MIG).",
        "gauge",
    )
    for usage in snapshot.pods:
        labels = naming.entity(usage.entity, usage.pod, usage.claim, usage.pod_uid)
        if usage.memory_used_bytes is not None:
            memory.samples.append(Sample(memory.name, labels, usage.memory_used_bytes))
        if usage.sm_utilization is not None:
            util.samples.append(Sample(util.name, labels, usage.sm_utilization))
    yield memory
    yield util


def _stats_families(stats: TelemetryStats) -> Iterator[Metric]:
    view = stats.view()
    yield _histogram(
        "gpu_agent_collection_duration_seconds",
        "Time one collection tick took (NVML reads, GPM, pods).",
        view.collection,
    )
    yield _histogram(
        "gpu_agent_scrape_duration_seconds",
        "Time rendering /metrics took (as of the previous render).",
        view.scrape,
    )
    errors = Metric(
        "gpu_agent_telemetry_errors", "Telemetry failures since start, by kind.", "counter"
    )
    for kind, count in view.errors:
        errors.samples.append(Sample("gpu_agent_telemetry_errors_total", {"kind": kind}, count))
    yield errors


def _histogram(name: str, help_text: str, histogram: Histogram) -> Metric:
    metric = Metric(name, help_text, "histogram")
    for bound, count in histogram.buckets:
        le = "+Inf" if bound == float("inf") else repr(bound)
        metric.samples.append(Sample(name + "_bucket", {"le": le}, float(count)))
    metric.samples.append(Sample(name + "_count", {}, float(histogram.count)))
    metric.samples.append(Sample(name + "_sum", {}, histogram.total))
    return metric
