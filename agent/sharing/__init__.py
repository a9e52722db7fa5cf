"""GPU sharing (time-slicing / MPS) through NVIDIA's k8s-device-plugin config: render, validate,
write, reload.

Modules: ``schema`` (the plugin's config file), ``validate`` and ``advertise`` (pure rules and
capacity), ``view`` (the records sharing reports), ``store`` (atomic file with previous version),
``reload`` (how the plugin learns of it), ``service`` (the flow). Kubernetes calls go through
:mod:`agent.kube`. This face is the records and pure parts, all a client needs; the service, which
needs the Kubernetes client, is imported from ``agent.sharing.service``.
"""

from agent.sharing.advertise import Advertised, advertise
from agent.sharing.schema import PluginConfig, parse, parse_requested, render, to_document
from agent.sharing.validate import validate, violations
from agent.sharing.view import ApplyResult, Pickup, ReloadReport, SharingView

__all__ = [
    "Advertised",
    "ApplyResult",
    "Pickup",
    "PluginConfig",
    "ReloadReport",
    "SharingView",
    "advertise",
    "parse",
    "parse_requested",
    "render",
    "to_document",
    "validate",
    "violations",
]
