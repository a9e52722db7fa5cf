"""Injected faults: "fail the Nth call of pynvml function F with NVML error E".

Faults live in the shared node state, so a fault armed by ``gpu-agent sim`` fails the agent's
call, and counting is consistent across processes. They apply to the pynvml functions as called
(``nvmlDeviceGetComputeRunningProcesses``, not the ``_v3`` C symbol it uses): one call of the
named function is one count.
"""

from __future__ import annotations

import difflib
import functools
import types

import pynvml

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.sim.state import Fault, NodeState


@functools.cache
def _functions() -> tuple[str, ...]:
    """Every NVML function pynvml has (its name is the driver's C symbol, nvmlDevice...)."""
    return tuple(
        name
        for name, value in vars(pynvml).items()
        if name.startswith("nvml") and isinstance(value, types.FunctionType)
    )


def _close_to(name: str, names: tuple[str, ...]) -> list[str]:
    """Up to five of ``names`` spelt like ``name``, case aside (a typo, a missing prefix)."""
    by_folded = {n.lower(): n for n in names}
    folded = name.lower()
    found = difflib.get_close_matches(folded, by_folded, n=5, cutoff=0.6)
    found += [k for k in by_folded if folded and folded in k and k not in found]
    return [by_folded[k] for k in found[:5]]


def check_function(name: str) -> str:
    if name in _functions():
        return name
    close = _close_to(name, _functions())
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else "expected NVML's C name, e.g. 'nvmlDeviceCreateGpuInstanceWithPlacement'"
    )
    raise InvalidSpec(
        f"function {name!r} is not an NVML function of pynvml: {hint}",
        [FieldViolation("function", "must name a pynvml nvml* function")],
    )


def error_code(error: str | int) -> int:
    """Accept 19, "NVML_ERROR_IN_USE", "IN_USE", "InUse" or "NVMLError_InUse"."""
    mapping = pynvml.NVMLError._valClassMapping
    code: int | None = None
    if isinstance(error, int) and not isinstance(error, bool):
        code = error
    elif isinstance(error, str):
        text = error.strip()
        name = text if text.startswith("NVML_ERROR_") else f"NVML_ERROR_{text.upper()}"
        constant = getattr(pynvml, name, None)
        if isinstance(constant, int):
            code = constant
        else:
            cls = getattr(
                pynvml, text if text.startswith("NVMLError_") else f"NVMLError_{text}", None
            )
            code = next((c for c, k in mapping.items() if k is cls), None)
    if code is None or code not in mapping:
        close = _close_to(str(error).removeprefix("NVML_ERROR_"), _errors())
        hint = (
            f": did you mean {', '.join(close)}?"
            if close
            else " (e.g. 'InUse', 'NVML_ERROR_IN_USE' or 19)"
        )
        raise InvalidSpec(
            f"error {error!r} is not an NVML error{hint}",
            [FieldViolation("error", "must name an NVML_ERROR_* code")],
        )
    return code


@functools.cache
def _errors() -> tuple[str, ...]:
    """The NVML error names without their prefix (IN_USE), as ``error_code`` takes them."""
    mapping = pynvml.NVMLError._valClassMapping
    return tuple(
        name.removeprefix("NVML_ERROR_")
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_ERROR_") and value in mapping
    )


#: The most calls a fault waits for (--nth) or fails (--count): a 32-bit count, far past any
#: test, so the state file never holds a number without bound.
MAX_CALLS = 2**31 - 1


def arm(
    node: NodeState, function: str, code: int, *, nth: int, count: int, gpu: int | None
) -> None:
    violations = [
        FieldViolation(name, f"must be 1..{MAX_CALLS}, got {value}")
        for name, value in (("nth", nth), ("count", count))
        if not 1 <= value <= MAX_CALLS
    ]
    if gpu is not None and not 0 <= gpu < len(node.gpus):
        violations.append(FieldViolation("gpu", f"must be 0..{len(node.gpus) - 1}, got {gpu}"))
    if violations:
        raise InvalidSpec("invalid fault: " + "; ".join(str(v) for v in violations), violations)
    node.faults.append(Fault(function, code, skip=nth - 1, remaining=count, gpu=gpu))


def armed_for(node: NodeState, function: str) -> bool:
    return any(f.function == function for f in node.faults)


def take(node: NodeState, function: str, gpu: int | None) -> int | None:
    """Count one call of ``function`` on ``gpu``; the NVML code it must fail with, if any."""
    code: int | None = None
    for fault in node.faults:
        if fault.function != function or (fault.gpu is not None and fault.gpu != gpu):
            continue
        if fault.skip > 0:
            fault.skip -= 1
        elif code is None:
            code = fault.code
            fault.remaining -= 1
    node.faults = [f for f in node.faults if f.remaining > 0]
    return code
