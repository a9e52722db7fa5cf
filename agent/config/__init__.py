"""Agent configuration: defaults < YAML file < env ``GPU_AGENT_*`` < flags, validated up front.

The frozen dataclasses of `schema` (its sections in `sections` and `prewarm`) are the schema.
Each field carries its rules (doc, allowed values, range, custom check: `rules`) as data in its
metadata; one generic path (`loader`) walks them to parse, coerce and validate every source, so
a new setting is one documented field and nothing else.

Keys are snake_case everywhere. In YAML, sections nest (``telemetry: {interval_s: 0.5}``); in env
they join with a double underscore (``GPU_AGENT_TELEMETRY__INTERVAL_S``); flags use dotted keys
(``telemetry.interval_s``). ``GPU_AGENT_CONFIG`` names the config file when none is passed.
"""

from typing import TYPE_CHECKING, Any

from agent.config.sections import (
    ApiSettings,
    DraSettings,
    DriverSettings,
    HealthSettings,
    MigSettings,
    OperationsSettings,
    RoleSettings,
    SharingSettings,
    TelemetrySettings,
    TlsSettings,
)

if TYPE_CHECKING:
    from agent.config.loader import CONFIG_ENV, ENV_PREFIX, config_schema, load_config
    from agent.config.prewarm import PrewarmSettings
    from agent.config.schema import DEFAULT_STATE_DIR, AgentConfig

# The loader (YAML, the prewarm section's checks) is imported on first use: a process that
# builds one section's settings, as the telemetry bench does, does not load it.
_LAZY = {
    "CONFIG_ENV": "loader",
    "ENV_PREFIX": "loader",
    "config_schema": "loader",
    "load_config": "loader",
    "PrewarmSettings": "prewarm",
    "DEFAULT_STATE_DIR": "schema",
    "AgentConfig": "schema",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"agent.config.{module}"), name)


__all__ = [
    "CONFIG_ENV",
    "DEFAULT_STATE_DIR",
    "ENV_PREFIX",
    "AgentConfig",
    "ApiSettings",
    "DraSettings",
    "DriverSettings",
    "HealthSettings",
    "MigSettings",
    "OperationsSettings",
    "PrewarmSettings",
    "RoleSettings",
    "SharingSettings",
    "TelemetrySettings",
    "TlsSettings",
    "config_schema",
    "load_config",
]
