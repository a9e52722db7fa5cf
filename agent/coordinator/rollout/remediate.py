"""`fleet remediate NODE`: what a failed GPU's health mark asks for, planned, then done.

The plan is pure (`plan_remedy`): from the node's GetNode answer, the GPUs to act on (one named
by ``--gpu``, else every failed one), the action their marks ask for, whether the node is
cordoned for it, and the pods to evict (those the marks name and those the agent attributes to
the GPUs now). A GPU that is not failed, or an action this command cannot take, is refused
before anything changes, naming why.

Done (`run_remedy`), in order: cordon (for ``reset-gpu`` and ``reboot-node``; not for ``restart-
application``, whose GPU stays usable), evict the pods through the Eviction API
(PodDisruptionBudgets respected, as `fleet apply mig --drain`: agent.coordinator.rollout.drain),
then the action: ``reset-gpu`` waits for the GPU's processes to end and asks the agent for a reset
(its ResetGpu, the reset MIG mode changes use: the one owner of the GPU); ``reboot-node`` says a
reboot is needed and never reboots; ``restart-application`` is the evictions themselves. The node
is uncordoned only once every GPU acted on reports healthy (and only if this command cordoned it);
past the timeout it stays cordoned, and the outcome says so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.client import AsyncAgentClient as AgentClient
from agent.coordinator.fleet.health import ACTIONS, FAILED, HEALTHY, GpuMark, gpu_marks
from agent.coordinator.rollout.drain import DrainApi, evict
from agent.errors import (
    AgentError,
    Conflict,
    DriverNotReady,
    FieldViolation,
    InvalidSpec,
    NotSupported,
)
from agent.wire.node import NodeGpu, NodeView

__all__ = ["GpuRemedy", "Outcome", "Remedy", "plan_remedy", "remedy_for", "run_remedy"]

RESET, REBOOT, RESTART = "reset-gpu", "reboot-node", "restart-application"
#: the actions this command takes, weakest first (a GPU with several failed marks takes the
#: strongest)
TAKEN = (RESTART, RESET, REBOOT)
#: actions that take the GPU (or the node) away from pods while they are done
_CORDONED = (RESET, REBOOT)

Pod = tuple[str, str]


@dataclass(frozen=True, slots=True)
class GpuRemedy:
    index: int
    uuid: str
    #: the failed verdicts on the GPU, in words (GPU's own, its instances')
    failures: tuple[str, ...]
    action: str
    pods: tuple[Pod, ...]


@dataclass(frozen=True, slots=True)
class Remedy:
    node: str
    gpus: tuple[GpuRemedy, ...]
    cordon: bool
    #: pod names in the marks that are not namespace/name: shown, not evicted
    unparsed: tuple[str, ...] = ()

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(dict.fromkeys(p for g in self.gpus for p in g.pods))

    def steps(self) -> list[str]:
        """What would happen, in order, in words."""
        out = [f"cordon {self.node}"] if self.cordon else []
        out += [
            f"evict {ns}/{name} (Eviction API: PodDisruptionBudgets respected)"
            for ns, name in self.pods
        ]
        for g in self.gpus:
            if g.action == RESET:
                out.append(f"reset GPU {g.index} through its agent once its processes have ended")
            elif g.action == REBOOT:
                out.append(f"GPU {g.index}: {self.node} needs a reboot: not done here (reboot it)")
            else:
                out.append(f"GPU {g.index}: its application restarts by the evictions above")
        if self.cordon and not any(g.action == REBOOT for g in self.gpus):
            gpus = ", ".join(str(g.index) for g in self.gpus)
            out.append(f"uncordon {self.node} once GPU {gpus} reports healthy")
        elif self.cordon:
            out.append(f"{self.node} stays cordoned until it is rebooted")
        return out


def _pod(text: str) -> Pod | None:
    namespace, sep, name = text.partition("/")
    return (namespace, name) if sep and namespace and name and "/" not in name else None


def _action(mark: GpuMark) -> str:
    """The strongest action the GPU's failed marks ask for; refused when one is none this
    command takes."""
    asked = [m.action for _, m in mark.failed_marks]
    for what, m in mark.failed_marks:
        if m.action not in TAKEN:
            why = (
                "names no action"
                if not m.action or m.action == "none"
                else "is not one of " + ", ".join(ACTIONS)
            )
            raise NotSupported(
                f"{what} is failed but its mark asks for action {m.action!r}, which {why}: "
                f"`fleet remediate` takes {', '.join(TAKEN)}"
            )
    return max(asked, key=TAKEN.index)


async def remedy_for(client: AgentClient, node: str, gpu: int | None) -> tuple[Remedy, bool]:
    """The remedy for ``gpu`` (None: every failed GPU) of ``node``, from what its agent says
    now (the marks, and the pods it attributes to each GPU); and whether the agent withholds
    pods from this identity, so only the pods the marks name are known."""
    answer = await client.node()
    failing = [m.index for m in gpu_marks(answer.gpus) if m.state == FAILED]
    chosen = [gpu] if gpu is not None else failing
    attributed = {i: sorted(await client.pods_on([i])) for i in chosen}
    return plan_remedy(node, answer, gpu, attributed), answer.processes_hidden


def failures(mark: GpuMark) -> tuple[str, ...]:
    """Each failed verdict's reason once, with what carries it. A GPU-wide fault marks the GPU
    and every instance on it alike: ``GPU 2 and 5 MIG instance(s) on it: XID 79 (...)``."""
    by_reason: dict[str, list[str]] = {}
    for what, mk in mark.failed_marks:
        by_reason.setdefault(mk.reason, []).append(what)
    said = []
    for reason, whats in by_reason.items():
        who = ", ".join(whats)
        if whats[0] == f"GPU {mark.index}" and len(whats) > 1:
            who = f"{whats[0]} and {len(whats) - 1} MIG instance(s) on it"
        said.append(f"{who}: {reason}" if reason else who)
    return tuple(said)


def plan_remedy(
    node: str,
    answer: NodeView,
    gpu: int | None,
    attributed: Mapping[int, Sequence[Pod]],
) -> Remedy:
    """The remedy for ``gpu`` (None: every failed GPU) of ``node`` from its agent's answer;
    ``attributed``: the pods the agent attributes to each GPU now. Refuses (changing nothing)
    a GPU the node lacks or that is not failed, and an action it cannot take, and GPUs its
    agent has not read (driver not ready): unknown, not absent."""
    unread = answer.driver.why_not
    if unread is not None:
        raise DriverNotReady(
            f"the GPUs of {node} were not read: {unread}: nothing to remediate until its "
            "driver is ready"
        )
    marks = gpu_marks(answer.gpus)
    if gpu is not None:
        found = [m for m in marks if m.index == gpu]
        if not found:
            have = ", ".join(str(m.index) for m in marks) or "none"
            raise InvalidSpec(
                f"{node} has no GPU {gpu} (GPUs: {have})", [FieldViolation("gpu", f"one of {have}")]
            )
        if found[0].state != FAILED:
            raise Conflict(
                f"GPU {gpu} of {node} is {found[0].state}, not failed: nothing to remediate "
                f"({found[0].describe()})"
            )
        chosen = found
    else:
        chosen = [m for m in marks if m.state == FAILED]
        if not chosen:
            states = ", ".join(f"GPU {m.index} {m.state}" for m in marks) or "no GPU"
            raise Conflict(f"no GPU of {node} is failed ({states}): nothing to remediate")
    gpus = []
    unparsed: list[str] = []
    for m in chosen:
        pods: dict[Pod, None] = {}
        for text in m.pods:
            parsed = _pod(text)
            if parsed is None:
                unparsed.append(text)
            else:
                pods[parsed] = None
        pods.update(dict.fromkeys(sorted(attributed.get(m.index, ()))))
        gpus.append(GpuRemedy(m.index, m.uuid, failures(m), _action(m), tuple(pods)))
    cordon = any(g.action in _CORDONED for g in gpus)
    return Remedy(node, tuple(gpus), cordon, tuple(unparsed))


@dataclass(frozen=True, slots=True)
class Outcome:
    #: healthy (every GPU acted on reports healthy; uncordoned if cordoned here),
    #: reboot-needed (evicted; the node stays cordoned for its reboot), restarted (evicted;
    #: the mark clears when the agent sees the GPU healthy), not-healthy (the timeout passed:
    #: left cordoned)
    result: str
    detail: str
    #: this command cordoned the node and left it so
    cordoned: bool


async def _processes_end(
    client: AgentClient, indices: Sequence[int], poll_s: float, deadline: float
) -> None:
    while True:
        answer = await client.node()
        chosen = [g for g in answer.gpus if g.layout.gpu.index in indices]
        busy = [g.layout.gpu.index for g in chosen if g.layout.processes]
        # A process list the agent could not read is not an empty one: waited on too.
        unread = {g.layout.gpu.index: g.unread or "never read" for g in chosen if _unread(g)}
        if not busy and not unread:
            return
        if time.monotonic() >= deadline:
            said = [f"GPU {', '.join(map(str, busy))} still runs processes"] if busy else []
            said += [f"GPU {i}'s processes are not known ({why})" for i, why in unread.items()]
            raise Conflict(
                f"{'; '.join(said)} after the evictions: not reset (a process no pod owns? "
                "stop it and run again)"
            )
        await asyncio.sleep(poll_s)


def _unread(gpu: NodeGpu) -> bool:
    return bool(gpu.unread or gpu.never_read)


async def _healthy(
    client: AgentClient, indices: Sequence[int], poll_s: float, deadline: float
) -> tuple[bool, str]:
    while True:
        marks = {m.index: m for m in gpu_marks((await client.node()).gpus)}
        left = [marks[i] for i in indices if i in marks and marks[i].state != HEALTHY]
        gone = [i for i in indices if i not in marks]
        if not left and not gone:
            return True, ""
        if time.monotonic() >= deadline:
            words = [m.describe() for m in left] + [f"GPU {i} not reported" for i in gone]
            return False, "; ".join(words)
        await asyncio.sleep(poll_s)


async def run_remedy(
    remedy: Remedy,
    client: AgentClient,
    kube: DrainApi | None,
    progress: Callable[[str], None],
    *,
    request_id: str,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
) -> Outcome:
    """Do ``remedy`` (see the module); ``kube`` is needed to cordon or evict."""
    deadline = time.monotonic() + timeout_s
    if kube is None and (remedy.cordon or remedy.pods):
        raise NotSupported("cordoning and evicting need a Kubernetes API (a pod or KUBECONFIG)")
    resets = [g.index for g in remedy.gpus if g.action == RESET]
    for index in resets:  # can the agent reset at all? before anything changes
        await client.reset_gpu(index, validate_only=True)
    was_cordoned = False
    if remedy.cordon:
        assert kube is not None
        was_cordoned = await asyncio.to_thread(kube.cordon, remedy.node)
        progress(
            f"{remedy.node} was already cordoned: left so"
            if was_cordoned
            else f"cordoned {remedy.node}"
        )
    cordoned = remedy.cordon and not was_cordoned
    try:
        return await _act(remedy, client, kube, progress, request_id, cordoned, deadline, poll_s)
    except (AgentError, asyncio.CancelledError):
        if cordoned:  # the GPU is still failed: pods must not land on it
            progress(f"stopped: {remedy.node} left cordoned (kubectl uncordon {remedy.node})")
        raise


async def _act(
    remedy: Remedy,
    client: AgentClient,
    kube: DrainApi | None,
    progress: Callable[[str], None],
    request_id: str,
    cordoned: bool,
    deadline: float,
    poll_s: float,
) -> Outcome:
    resets = [g.index for g in remedy.gpus if g.action == RESET]
    for namespace, pod in remedy.pods:
        assert kube is not None
        await evict(kube, namespace, pod, progress)
        progress(f"evicted {namespace}/{pod}")
    if any(g.action == REBOOT for g in remedy.gpus):
        reboot = [g for g in remedy.gpus if g.action == REBOOT]
        why = "; ".join(f for g in reboot for f in g.failures)
        return Outcome(
            "reboot-needed",
            f"{remedy.node} needs a reboot ({why}): not done by gpu-agent; "
            + ("it stays cordoned until then" if remedy.cordon else "reboot it"),
            cordoned,
        )
    if resets:
        await _processes_end(client, resets, poll_s, deadline)
        for index in resets:
            await client.reset_gpu(index, request_id=f"{request_id}/{index}")
            progress(f"reset GPU {index}")
    if not remedy.cordon:
        return Outcome(
            "restarted",
            "the pods were evicted; the mark clears when the agent sees the GPU healthy",
            False,
        )
    indices = [g.index for g in remedy.gpus]
    healthy, why = await _healthy(client, indices, poll_s, deadline)
    if not healthy:
        left = f"{remedy.node} left cordoned" if cordoned else f"{remedy.node} was cordoned before"
        return Outcome(
            "not-healthy",
            f"not healthy in time ({why}): {left}; uncordon it "
            f"(kubectl uncordon {remedy.node}) once the GPU is",
            cordoned,
        )
    gpus = ", ".join(map(str, indices))
    if cordoned:
        assert kube is not None
        await asyncio.to_thread(kube.uncordon, remedy.node)
        progress(f"GPU {gpus} healthy: uncordoned {remedy.node}")
        return Outcome("healthy", f"GPU {gpus} healthy; uncordoned {remedy.node}", False)
    return Outcome(
        "healthy", f"GPU {gpus} healthy; {remedy.node} was cordoned before: left so", False
    )
