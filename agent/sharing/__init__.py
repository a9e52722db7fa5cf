"""GPU sharing (time-slicing / MPS) through NVIDIA's k8s-device-plugin config: render, validate,
write, reload.

Modules: ``schema`` (the plugin's config file), ``validate`` and ``advertise`` (pure rules and
capacity), ``store`` (atomic file with previous version), ``reload`` (how the plugin learns of
it), ``service`` (the flow). Kubernetes calls go through :mod:`agent.kube`.
"""

from agent.sharing.advertise import Advertised, advertise
from agent.sharing.reload import Pickup, ReloadReport
from agent.sharing.schema import PluginConfig, parse, render, to_document
from agent.sharing.service import ApplyResult, SharingService, SharingSettings, SharingView
from agent.sharing.validate import validate, violations

__all__ = [
    "Advertised",
    "ApplyResult",
    "Pickup",
    "PluginConfig",
    "ReloadReport",
    "SharingService",
    "SharingSettings",
    "SharingView",
    "advertise",
    "parse",
    "render",
    "to_document",
    "validate",
    "violations",
]
