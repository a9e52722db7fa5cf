"""The allocation mode's source as the agent builds it: the config's mode, or detection over
the API (`AllocationWatch`), and on a cluster the republisher a MIG apply on a ``dra`` node
uses (agent/dra/republish.py)."""

from __future__ import annotations

from typing import Protocol

from agent.dra.detect import configured
from agent.dra.republish import Republisher
from agent.dra.watch import AllocationSource, AllocationWatch
from agent.kube import KubeClient
from agent.kube_edge import KubeEdge

__all__ = ["DraSettings", "allocation_source"]


class DraSettings(Protocol):
    """The ``dra`` section of the agent's config (agent/config.py) this reads."""

    @property
    def mode(self) -> str: ...
    @property
    def driver(self) -> str: ...
    @property
    def plugin_namespace(self) -> str: ...
    @property
    def plugin_label_selector(self) -> str: ...
    @property
    def republish_timeout_s(self) -> float: ...


def allocation_source(
    dra: DraSettings, node: str, kube: KubeClient | None, edge: KubeEdge | None
) -> tuple[AllocationSource, Republisher | None]:
    # A mode set in config needs no watch, except dra: its applies wait for the slices.
    if kube is None or edge is None or dra.mode not in ("auto", "dra"):
        return AllocationSource(configured(dra.mode, dra.driver), None), None
    watch = AllocationWatch(
        edge.client, node, dra.driver, slices=edge.slices(), node_informer=edge.node_informer()
    )
    republish = Republisher(
        kube,
        watch,
        namespace=dra.plugin_namespace,
        label_selector=dra.plugin_label_selector,
        timeout_s=dra.republish_timeout_s,
    )
    return AllocationSource(configured(dra.mode, dra.driver), watch), republish
