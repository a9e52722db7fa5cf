"""The device plugin's ``flags`` section as the plugin reads it: every field with its Go type.

The plugin (and GFD) read the shared file with sigs.k8s.io/yaml into the Go structs of
``api/config/v1/flags.go``: YAML becomes JSON, then encoding/json fills typed fields, and one value
of the wrong type stops the plugin at start ("unable to parse config file"). So a value that is
fine YAML can still be one the plugin cannot run:

* ``*bool`` takes a YAML boolean only: ``"false"`` (a string) is an error;
* ``*string`` takes a string; a YAML number or boolean is turned into its text first;
* ``*Duration`` (``gfd.sleepInterval``) takes a number (nanoseconds) or a string that Go's
  ``time.ParseDuration`` accepts, or ``infinite``;
* ``deviceListStrategy`` takes one string or a list of strings;
* ``plugin`` and ``gfd`` are mappings.

Keys are matched as encoding/json matches them: exactly, else ignoring case. Keys the structs do
not have are dropped by the plugin; they are kept verbatim here. Enumerations the plugin checks at
start (``validateFlags``) are checked after the type. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from agent.errors import FieldViolation
from agent.safeyaml import brief

Kind = Literal["bool", "string", "duration", "string-list", "mapping"]

#: Values the plugin accepts (cmd/nvidia-device-plugin/main.go validateFlags).
DEVICE_ID_STRATEGIES = ("uuid", "index")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
ALLOCATION_POLICIES = ("distributed", "packed")
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")

#: flags.go CommandLineFlags (``migStrategy`` is parsed by schema.py, checked there).
TOP: dict[str, Kind] = {
    "failOnInitError": "bool",
    "mpsRoot": "string",
    "nvidiaDriverRoot": "string",
    "nvidiaDevRoot": "string",
    "gdrcopyEnabled": "bool",
    "gdsEnabled": "bool",
    "mofedEnabled": "bool",
    "useNodeFeatureAPI": "bool",
    "deviceDiscoveryStrategy": "string",
    "plugin": "mapping",
    "gfd": "mapping",
}
#: flags.go PluginCommandLineFlags.
PLUGIN: dict[str, Kind] = {
    "passDeviceSpecs": "bool",
    "deviceListStrategy": "string-list",
    "deviceIDStrategy": "string",
    "cdiAnnotationPrefix": "string",
    "nvidiaCTKPath": "string",
    "containerDriverRoot": "string",
    "sharedDevicesAllocationPolicy": "string",
}
#: flags.go GFDCommandLineFlags.
GFD: dict[str, Kind] = {
    "oneshot": "bool",
    "noTimestamp": "bool",
    "sleepInterval": "duration",
    "outputFile": "string",
    "machineTypeFile": "string",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "deviceDiscoveryStrategy": DISCOVERY_STRATEGIES,
    "deviceIDStrategy": DEVICE_ID_STRATEGIES,
    "deviceListStrategy": DEVICE_LIST_STRATEGIES,
    "sharedDevicesAllocationPolicy": ALLOCATION_POLICIES,
}
_EXPECT: dict[Kind, str] = {
    "bool": "true or false (a YAML boolean, not a string)",
    "string": "a string",
    "duration": (
        "a Go duration such as 30s, 1m30s, 1h or infinite (time.ParseDuration: a number and a "
        "unit ns, us, ms, s, m or h, no spaces), or a number of nanoseconds"
    ),
    "string-list": "a string or a list of strings",
    "mapping": "a mapping",
}
_STOP = " (the plugin cannot parse the file and does not start)"

# Go's time.ParseDuration units, in nanoseconds.
_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_COMPONENT = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_MAX = 1 << 63


def parse_go_duration(text: str) -> int:
    """Nanoseconds for ``text`` as Go's ``time.ParseDuration`` reads it; ValueError otherwise.

    The grammar is ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` with the units above, or a bare ``0``;
    the total must fit an int64.
    """
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while s:
        m = _COMPONENT.match(s)
        assert m is not None  # the pattern matches the empty string
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"invalid duration {text!r}")
        if not unit:
            raise ValueError(f"missing unit in duration {text!r}")
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        scale = _UNITS[unit]
        value = int(whole or "0") * scale
        if frac:
            value += int(int(frac) * (scale / 10 ** len(frac)))
        total += value
        if total > _MAX:
            raise ValueError(f"invalid duration {text!r} (out of range)")
        s = s[m.end() :]
    if not negative and total > _MAX - 1:
        raise ValueError(f"invalid duration {text!r} (out of range)")
    return -total if negative else total


def violations(flags: Mapping[str, object]) -> list[FieldViolation]:
    """Every ``flags`` value (other than ``migStrategy``) the plugin cannot parse or run."""
    found: list[FieldViolation] = []
    _section(found, "flags", flags, TOP)
    for name, fields in (("plugin", PLUGIN), ("gfd", GFD)):
        for key, value in _matching(flags, name):
            if isinstance(value, Mapping):
                _section(found, f"flags.{key}", value, fields)
    return found


def _matching(section: Mapping[str, object], name: str) -> list[tuple[str, object]]:
    # encoding/json fills a field from an exact key, or else from one equal ignoring case.
    return [(str(k), v) for k, v in section.items() if str(k).casefold() == name.casefold()]


def _section(
    found: list[FieldViolation], path: str, section: Mapping[str, object], fields: dict[str, Kind]
) -> None:
    for name, kind in fields.items():
        for key, value in _matching(section, name):
            at = f"{path}.{key}"
            problem = _type_problem(kind, value)
            if problem is not None:
                found.append(FieldViolation(at, f"must be {_EXPECT[kind]}, got {problem}{_STOP}"))
            elif name in _CHOICES:
                _choices(found, at, value, _CHOICES[name])


def _type_problem(kind: Kind, value: object) -> str | None:
    """Why the plugin cannot read ``value`` as ``kind`` (None when it can). YAML null leaves a
    field unset, which every field allows."""
    if value is None:
        return None
    ok = {
        "bool": isinstance(value, bool),
        # sigs.k8s.io/yaml turns a YAML number or boolean into its text for a string field.
        "string": isinstance(value, str | int | float),
        "string-list": isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
        "mapping": isinstance(value, Mapping),
    }
    if kind == "duration":
        return _duration_problem(value)
    return None if ok[kind] else brief(value)


def _duration_problem(value: object) -> str | None:
    # Duration.UnmarshalJSON: a JSON number is nanoseconds, a string is parsed, nothing else.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None
    if isinstance(value, str):
        if value == "infinite":
            return None
        try:
            parse_go_duration(value)
        except ValueError as exc:
            return f"{brief(value)} ({exc})"
        return None
    return brief(value)


def _choices(found: list[FieldViolation], at: str, value: object, allowed: tuple[str, ...]) -> None:
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        item_at = f"{at}[{i}]" if isinstance(value, list) else at
        # A number or boolean reaches the plugin as its text, which is never one of these.
        if item is not None and item not in allowed:
            found.append(
                FieldViolation(
                    item_at,
                    f"must be one of {', '.join(allowed)}, got {brief(item)} (the plugin refuses "
                    "to start)",
                )
            )
