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

import asyncio
import functools
import gzip
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from agent.http import Request, Response
from agent.telemetry.encode import ClassicCounter, encode
from agent.telemetry.naming import DcgmNaming, Labels, LabelValue, Naming, NativeNaming
from agent.telemetry.published import Published
from agent.telemetry.snapshot import EntitySample, GpuIdentity, Snapshot
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

__all__ = ["Body", "MetricsExporter", "families", "own_families"]

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


@dataclass(frozen=True, slots=True)
class Body:
    """One encoded /metrics page: the snapshot it shows, the published version it includes,
    identity bytes and (when a client asked for gzip lately) the same gzipped."""

    snapshot: Snapshot | None
    version: int
    plain: bytes
    gzipped: bytes | None


class MetricsExporter:
    """The /metrics handler: ``latest`` returns the newest snapshot (or None before the first);
    ``published`` holds every other owner's record.

    The page is encoded once per change or tick, never per scrape: by the sampler thread when
    it publishes a snapshot (:meth:`prerender`) and by the publication tick when a record
    changed (:meth:`refresh`), in each format scraped lately, identity and gzip. A scrape
    returns those bytes; one that finds them stale (a format's first scrape) waits for one
    encode in a worker thread, shared by every scrape that arrives meanwhile.
    """

    def __init__(
        self,
        counters: CounterSet,
        metric_names: str,
        latest: Callable[[], Snapshot | None],
        stats: TelemetryStats,
        clock: Callable[[], float] = time.perf_counter,
        devices: str = "f",
        published: Published | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self._counters = counters
        self._devices = devices
        self._native = metric_names == "native"
        self._latest = latest
        self._stats = stats
        self._clock = clock
        self.published = published if published is not None else Published()
        self.published.register("telemetry", own_families(counters, self._native))
        self._lock = threading.Lock()
        #: held while encoding: concurrent builders wait, then find the body current
        self._building = threading.Lock()
        #: openmetrics? -> the latest page in that format
        self._bodies: dict[bool, Body] = {}
        #: openmetrics? -> (snapshot, its families encoded, without "# EOF")
        self._parts: dict[bool, tuple[Snapshot | None, bytes | memoryview]] = {}
        #: (openmetrics?, gzip?) -> when it was last asked for
        self._asked: dict[tuple[bool, bool], float] = {}
        #: the snapshot being published (`prerender` runs just before `latest` returns it)
        self._ahead: Snapshot | None = None
        self._inflight: dict[tuple[bool, bool], asyncio.Future[Body]] = {}
        self._refreshed_at = float("-inf")
        self._tick_s = tick_s

    def publish_from(
        self,
        owner: str,
        collector: Collector,
        subscribe: Callable[[Callable[..., None]], object] | None = None,
    ) -> None:
        """Serve ``collector``'s families, read on every tick (`refresh`) and, when the owner
        tells its changes (``subscribe``), at each change; never on a scrape. DuplicateFamily
        when one is served already."""
        self.published.poll(owner, collector)
        if subscribe is not None:
            subscribe(lambda *_: self.published.changed(owner))

    def render(self, accept: str, gzip_ok: bool = False) -> tuple[bytes, str]:
        """(body, content type) for an Accept header; encodes now when the page is stale."""
        openmetrics, content_type = _format(accept)
        body = self._current(openmetrics, gzip_ok) or self._build(openmetrics, gzip_ok)
        return body.plain, content_type

    def prerender(self, snapshot: Snapshot) -> None:
        """Encode ``snapshot`` in the formats scraped within the last ``_PRERENDER_FOR_S``."""
        self._ahead = snapshot
        self.published.refresh()
        self._refreshed_at = self._clock()
        self._build_asked(force=True)

    def refresh(self) -> None:
        """The publication tick (off the event loop): read the polled owners, and re-encode
        the formats scraped lately when a record changed, or with no snapshot (the agent's
        own series still move)."""
        changed = self.published.refresh()
        self._refreshed_at = self._clock()
        self._build_asked(force=changed or self._snapshot() is None)

    def tick(self) -> None:
        """The agent's timer: `refresh`, unless the sampler's last snapshot did within the
        tick (while attached, the sampler's tick is the publication tick)."""
        if self._clock() - self._refreshed_at >= self._tick_s:
            self.refresh()

    def _build_asked(self, force: bool) -> None:
        now = self._clock()
        with self._lock:
            asked = [k for k, at in self._asked.items() if now - at < _PRERENDER_FOR_S]
        for openmetrics in sorted({om for om, _ in asked}):
            gzip_ok = (openmetrics, True) in asked
            if force or self._current(openmetrics, gzip_ok) is None:
                self._build(openmetrics, gzip_ok, force=True)

    def _snapshot(self) -> Snapshot | None:
        latest, ahead = self._latest(), self._ahead
        if latest is None or ahead is None or ahead.taken_mono < latest.taken_mono:
            return latest
        return ahead

    def _current(self, openmetrics: bool, gzip_ok: bool) -> Body | None:
        body = self._bodies.get(openmetrics)
        if body is None or body.snapshot is not self._snapshot():
            return None
        if body.version != self.published.version:
            return None
        return None if gzip_ok and body.gzipped is None else body

    def _build(self, openmetrics: bool, gzip_ok: bool, *, force: bool = False) -> Body:
        with self._building:
            if not force:
                current = self._current(openmetrics, gzip_ok)
                if current is not None:
                    return current
            snapshot = self._snapshot()
            version, records = self.published.latest()
            with self._lock:
                part = self._parts.get(openmetrics)
            if part is None or part[0] is not snapshot or snapshot is None:
                rendered = families(
                    snapshot, self._counters, self._native, self._stats, self._devices
                )
                part = (snapshot, encode(rendered, openmetrics).removesuffix(b"# EOF\n"))
            end = b"# EOF\n" if openmetrics else b""
            plain = b"".join([part[1], *(r.body(openmetrics) for r in records), end])
            gzipped = gzip.compress(plain, compresslevel=6, mtime=0) if gzip_ok else None
            body = Body(snapshot, version, plain, gzipped)
            # The snapshot's part is kept as a view of the body it starts: one copy in memory.
            part = (snapshot, memoryview(plain)[: len(part[1])])
            with self._lock:
                self._parts[openmetrics] = part
                self._bodies[openmetrics] = body
            self._stats.encoded()
            return body

    async def handle(self, request: Request) -> Response:
        started = self._clock()
        openmetrics, content_type = _format(request.headers.get("accept", ""))
        gzip_ok = request.accepts_gzip
        key = (openmetrics, gzip_ok)
        with self._lock:
            self._asked[key] = started
        body = self._current(openmetrics, gzip_ok)
        if body is None:
            body = await self._shared_build(key)
        self._stats.observe_scrape(self._clock() - started)
        return Response(200, body.plain, content_type, gzipped=body.gzipped)

    async def _shared_build(self, key: tuple[bool, bool]) -> Body:
        """One encode in a worker thread for every scrape of ``key`` waiting meanwhile."""
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(asyncio.to_thread(self._build, *key))
            self._inflight[key] = future
            future.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(future)


@functools.lru_cache(maxsize=16)  # a scraper sends the same header every time
def _format(accept: str) -> tuple[bool, str]:
    """(OpenMetrics?, content type) for an Accept header."""
    _, content_type = choose_encoder(accept)
    return content_type.startswith("application/openmetrics-text"), content_type


def own_families(counters: CounterSet, native: bool) -> list[str]:
    """Every family name the snapshot's rendering can emit, claimed in the registry."""
    names = [
        "gpu_agent_gpu",
        "gpu_agent_gpu_up",
        "gpu_agent_gpu_read",
        "gpu_agent_xid_errors",
        "gpu_agent_idle_seconds",
        "gpu_agent_pod_memory_used_bytes",
        "gpu_agent_pod_sm_utilization_ratio",
        "gpu_agent_field_supported",
        "gpu_agent_collection_source_up",
        "gpu_agent_snapshot_timestamp_seconds",
        "gpu_agent_dcgm_field_unserved",
        *STATS_FAMILIES,
    ]
    for counter in counters.values:
        if native and isinstance(counter.field.source, XidEvents):
            continue  # native XIDs are gpu_agent_xid_errors
        names.append(counter.field.native if native else counter.name)
    return list(dict.fromkeys(names))


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
    counts = ((x.entity.gpu, {"xid": str(x.xid)}, x.count) for x in snapshot.xid_recent)
    return _window_counts(counter, naming, native, XID_WINDOW_S, counts)


def _clock_events(
    counter: Counter, snapshot: Snapshot, naming: Naming, native: bool
) -> Iterator[Metric]:
    """dcgm-exporter's DCGM_EXP_CLOCK_EVENTS_COUNT: per GPU and reason, samples in the window."""
    counts = ((c.gpu, {"clock_event": c.reason}, c.count) for c in snapshot.clock_events)
    return _window_counts(counter, naming, native, CLOCK_EVENT_WINDOW_S, counts)


def _window_counts(
    counter: Counter,
    naming: Naming,
    native: bool,
    window_s: float,
    counts: Iterable[tuple[GpuIdentity, dict[str, str], int]],
) -> Iterator[Metric]:
    """A count per GPU (and what was counted) over the last ``window_s``, labelled with it."""
    name = counter.field.native if native else counter.name
    metric = Metric(name, counter.help, "gauge")
    window = {"window_size_in_ms": str(int(window_s * 1000))}
    for gpu, what, count in counts:
        labels = {**naming.gpu(gpu), **what, **window}
        metric.samples.append(Sample(name, labels, float(count)))
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
    up = Metric(
        "gpu_agent_gpu_up",
        "1 when the GPU answers NVML, 0 when it is lost; absent for one not read yet (unknown).",
        "gauge",
    )
    read = Metric(
        "gpu_agent_gpu_read",
        "1 when the GPU's layout and processes were read this tick, 0 when not (lost, or the "
        "call failed: gpu-agent status names it); the one series of a GPU never read.",
        "gauge",
    )
    for status in snapshot.gpus:
        labels = naming.gpu(status.gpu)
        if status.up is not None:  # a GPU never read is not known to work
            up.samples.append(Sample(up.name, labels, float(status.up)))
        fresh = status.up is True and not status.unread
        read.samples.append(Sample(read.name, labels, 1.0 if fresh else 0.0))
    yield up
    yield read

    xids = Metric("gpu_agent_xid_errors", "XID errors seen since the agent started.", "counter")
    first = Metric(
        "gpu_agent_xid_errors_first_seen_timestamp_seconds",
        "When (Unix time) the first XID of its gpu_agent_xid_errors_total series came: the "
        "series counts from then. Rules count a series whole only when this is within their "
        "window, so a Prometheus that missed it for a while does not count old XIDs as new.",
        "gauge",
    )
    for x in snapshot.xids:
        labels = {**naming.entity(x.entity, None), "xid": str(x.xid)}
        xids.samples.append(Sample("gpu_agent_xid_errors_total", labels, float(x.count)))
        if x.first_seen is not None:
            first.samples.append(Sample(first.name, labels, x.first_seen))
    yield xids
    yield first

    idle = Metric(
        "gpu_agent_idle_seconds",
        "Seconds since utilisation was last above the idle threshold, counted from when this "
        "agent first read the GPU or instance: time no agent watched (a restart) or whose "
        "utilisation could not be read is unknown, never idle.",
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

    sources = Metric(
        "gpu_agent_collection_source_up",
        "1 when a telemetry source was read this tick; 0 with the reason while it fails: its "
        "series are absent (pods and dra keep their last answer), the other sources' are "
        "published.",
        "gauge",
    )
    for source in snapshot.sources:
        reason = {} if source.degraded is None else {"reason": source.degraded}
        value = 1.0 if source.degraded is None else 0.0
        sources.samples.append(Sample(sources.name, {"source": source.source, **reason}, value))
    yield sources

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
    sources = Metric(
        "gpu_agent_collection_source_duration_seconds",
        "Time one read of a collection source took: each reader (devices, gpm, dcgm, xid, pods, "
        "dra, processes), layouts (MIG), attribution, kubelet (PodResources List).",
        "histogram",
    )
    last = Metric(
        "gpu_agent_collection_source_timestamp_seconds",
        "Unix time a collection source was last read; time() minus it is its age.",
        "gauge",
    )
    for source in view.sources:
        _add_histogram(sources, source.duration, {"source": source.source})
        last.samples.append(Sample(last.name, {"source": source.source}, source.last_at))
    yield sources
    yield last
    encodes = Metric(
        "gpu_agent_metrics_encodes",
        "Times the /metrics page was encoded: once per change or tick in each format scraped "
        "lately, shared by concurrent scrapes.",
        "counter",
    )
    encodes.samples.append(Sample("gpu_agent_metrics_encodes_total", {}, float(view.encodes)))
    yield encodes
    errors = Metric(
        "gpu_agent_telemetry_errors", "Telemetry failures since start, by kind.", "counter"
    )
    for kind, count in view.errors:
        errors.samples.append(Sample("gpu_agent_telemetry_errors_total", {"kind": kind}, count))
    yield errors


def _histogram(name: str, help_text: str, histogram: Histogram) -> Metric:
    metric = Metric(name, help_text, "histogram")
    _add_histogram(metric, histogram, {})
    return metric


def _add_histogram(metric: Metric, histogram: Histogram, labels: dict[str, str]) -> None:
    name = metric.name
    for bound, count in histogram.buckets:
        le = "+Inf" if bound == float("inf") else repr(bound)
        metric.samples.append(Sample(name + "_bucket", {**labels, "le": le}, float(count)))
    metric.samples.append(Sample(name + "_count", labels, float(histogram.count)))
    metric.samples.append(Sample(name + "_sum", labels, histogram.total))


STATS_FAMILIES = (
    "gpu_agent_collection_duration_seconds",
    "gpu_agent_scrape_duration_seconds",
    "gpu_agent_collection_source_duration_seconds",
    "gpu_agent_collection_source_timestamp_seconds",
    "gpu_agent_metrics_encodes",
    "gpu_agent_telemetry_errors",
)
