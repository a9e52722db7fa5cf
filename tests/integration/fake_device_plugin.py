"""A stand-in for NVIDIA's device plugin, for tests: reads its config at start and on SIGHUP.

Run it through a link named ``nvidia-device-plugin`` to the Python interpreter, so that the
process's name is what the real plugin's is (psutil reads the full name from the command line
when the kernel's 15-character comm is cut):

    nvidia-device-plugin fake_device_plugin.py --config-file PATH --gpus 8

For each load it prints one JSON line: ``{"event": "loaded", "pid": N, "advertise": {...},
"mig_strategy": S}`` (or ``"event": "error"``). ``S`` is taken as the real plugin takes it: its
``--mig-strategy`` flag, else its ``MIG_STRATEGY`` environment variable (set but empty counts),
else the file's ``flags.migStrategy``, else ``none`` (api/config/v1 flags.go). It models only
full GPUs, written independently of agent.sharing so that it checks what the agent writes rather
than agreeing with it by construction. SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import yaml


def read(path: str) -> dict[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except FileNotFoundError:
        return {}


def mig_strategy(flag: str | None, doc: dict[str, object]) -> str:
    if flag is not None:
        return flag
    if "MIG_STRATEGY" in os.environ:
        return os.environ["MIG_STRATEGY"]
    flags = doc.get("flags") or {}
    return str(flags.get("migStrategy") or "none") if isinstance(flags, dict) else "none"


def advertise(doc: dict[str, object], gpus: int) -> dict[str, int]:
    """nvidia.com/gpu as the plugin counts it: GPUs x replicas, ``.shared`` when renamed."""
    sharing = doc.get("sharing") or {}
    section = sharing.get("mps") or sharing.get("timeSlicing") or {}
    if "resources" in section and not section["resources"]:
        raise ValueError("no resources specified")
    replicas = 1
    for resource in section.get("resources", []):
        name = resource["name"]
        if not name.startswith("nvidia.com/"):
            name = "nvidia.com/" + name
        if resource["replicas"] < 2:
            raise ValueError("number of replicas must be >= 2")
        if name == "nvidia.com/gpu":
            replicas = resource["replicas"]
    renamed = replicas > 1 and section.get("renameByDefault", False)
    return {"nvidia.com/gpu.shared" if renamed else "nvidia.com/gpu": gpus * replicas}


def load(path: str, gpus: int, flag: str | None) -> None:
    try:
        doc = read(path)
        event = {
            "event": "loaded",
            "pid": os.getpid(),
            "advertise": advertise(doc, gpus),
            "mig_strategy": mig_strategy(flag, doc),
        }
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        event = {"event": "error", "pid": os.getpid(), "error": str(exc)}
    print(json.dumps(event), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--mig-strategy", default=None)
    args = parser.parse_args()
    # Block the signals before the first load is announced, so a SIGHUP sent right after the
    # announcement waits for sigwait instead of killing the process (SIGHUP's default action).
    wanted = {signal.SIGHUP, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    load(args.config_file, args.gpus, args.mig_strategy)
    while signal.sigwait(wanted) == signal.SIGHUP:
        load(args.config_file, args.gpus, args.mig_strategy)
    sys.exit(0)


if __name__ == "__main__":
    main()
