"""Label sets of the two naming schemes: dcgm-exporter's and Prometheus-idiomatic ("native").

``dcgm``: dcgm-exporter 4.x labels in its order (reference/telemetry.md §1.3) so dashboard 12239
and existing rules work unchanged. ``native``: snake_case, identity only on series and the rest on
``gpu_agent_gpu_info`` (§6, fact 9). Both put ``pod``/``namespace``/``container`` on series of a GPU
or instance allocated to exactly one container; scrape with ``honor_labels: true`` to keep them.
A DRA claim's rows add ``pod_uid`` and dcgm-exporter's ``dra_*`` labels, named as it names them,
in both schemes (docs/dra.md, "Telemetry on DRA nodes").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from agent.gpu.readings import GpuString
from agent.telemetry.snapshot import DraClaim, Entity, GpuIdentity, InstanceIdentity, PodRef

Labels = dict[str, str]
#: a label-type field's value: node-wide text, or the GPU's own string of that key
LabelValue = str | GpuString


class Naming(ABC):
    """How one scheme labels things: a GPU, and what an instance of it adds; a series of an
    entity also names the pod (and DRA claim) it is allocated to, the same in both schemes."""

    @abstractmethod
    def gpu(self, gpu: GpuIdentity) -> Labels: ...

    @abstractmethod
    def instance(self, instance: InstanceIdentity) -> Labels: ...

    def entity(
        self,
        entity: Entity,
        pod: PodRef | None,
        claim: DraClaim | None = None,
        pod_uid: str | None = None,
    ) -> Labels:
        labels = self.gpu(entity.gpu)
        if entity.instance is not None:
            labels.update(self.instance(entity.instance))
        return _pod(labels, pod, claim, pod_uid)


def _pod(labels: Labels, pod: PodRef | None, claim: DraClaim | None, pod_uid: str | None) -> Labels:
    if pod is None:
        return labels
    labels["pod"] = pod.name
    labels["namespace"] = pod.namespace
    labels["container"] = pod.container
    if pod_uid is not None:
        labels["pod_uid"] = pod_uid  # dcgm-exporter's name (--kubernetes-enable-pod-uid)
    if claim is not None:
        labels["dra_claim_name"] = claim.name
        labels["dra_claim_namespace"] = claim.namespace
        labels["dra_driver_name"] = claim.driver
        labels["dra_pool_name"] = claim.pool
        labels["dra_device_name"] = claim.device
        if claim.mig_profile is not None:
            labels["dra_mig_profile"] = claim.mig_profile
        if claim.mig_device_uuid is not None:
            labels["dra_mig_device_uuid"] = claim.mig_device_uuid
    return labels


class DcgmNaming(Naming):
    """dcgm-exporter's labels; ``extra`` holds the CSV's label-type fields in CSV order (name,
    node-wide value or per-GPU string key). A GPU string NVML did not answer is left out."""

    def __init__(self, hostname: str, extra: Sequence[tuple[str, LabelValue]]) -> None:
        self._hostname = hostname
        self._extra = tuple(extra)

    def gpu(self, gpu: GpuIdentity) -> Labels:
        labels = {
            "gpu": str(gpu.index),
            **_known(
                UUID=gpu.uuid,
                pci_bus_id=gpu.pci_bus_id,
                device=_device(gpu),
                modelName=gpu.name,
            ),
            "Hostname": self._hostname,
        }
        for name, value in self._extra:
            text = gpu.string(value) if isinstance(value, GpuString) else value
            if text is not None:
                labels[name] = text
        return labels

    def instance(self, instance: InstanceIdentity) -> Labels:
        return {"GPU_I_PROFILE": instance.profile, "GPU_I_ID": str(instance.gpu_instance_id)}


class NativeNaming(Naming):
    """Identity labels only; model, bus id, node and versions live on ``gpu_agent_gpu_info``."""

    def gpu(self, gpu: GpuIdentity) -> Labels:
        return {"gpu": str(gpu.index), **_known(uuid=gpu.uuid)}

    def instance(self, instance: InstanceIdentity) -> Labels:
        return {"gpu_instance_id": str(instance.gpu_instance_id), "gpu_profile": instance.profile}

    @staticmethod
    def info(gpu: GpuIdentity, node: str, versions: Mapping[str, str]) -> Labels:
        return {
            "gpu": str(gpu.index),
            **_known(
                uuid=gpu.uuid,
                pci_bus_id=gpu.pci_bus_id,
                device=_device(gpu),
                model_name=gpu.name,
            ),
            "node": node,
            **versions,
        }


def _device(gpu: GpuIdentity) -> str:
    return "" if gpu.minor is None else f"nvidia{gpu.minor}"


def _known(**labels: str) -> Labels:
    """The identity labels NVML answered: one a GPU lost before it answered lacks is left
    out, not published as "" or a guess (its series' labels stay those it has while lost)."""
    return {name: value for name, value in labels.items() if value}
