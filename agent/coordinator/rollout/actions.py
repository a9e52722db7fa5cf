"""What a rollout does to one node, per kind (MIG, sharing, prewarm), through the agent API.

Each action is idempotent per (rollout, node, attempt): its request id makes a retry, or a
resume after the coordinator died, find the operation the first call started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import prewarm_pb2, sharing_pb2
from agent.client import AsyncAgentClient as AgentClient
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.rollout import claims
from agent.coordinator.rollout.execute import NodeAction, NodeResult, Notes
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import NodeState
from agent.coordinator.rollout.targets import held_elsewhere, target_name
from agent.dra.mode import AllocationMode
from agent.errors import AgentError, Conflict, DriverNotReady, InvalidSpec
from agent.gpu.types import GpuLayout
from agent.mig.outcomes import NOT_ANSWERING, Unrolled
from agent.power.plan import resolve
from agent.power.spec import parse as parse_power
from agent.sharing import dra
from agent.sharing.reload import reload_again
from agent.sharing.schema import PluginConfig, merge, to_document
from agent.sharing.validate import violations
from agent.sharing.view import DraView, ReloadReport
from agent.wire.mig import REBOOT_APPLIES, MigPlanView
from agent.wire.operations import OperationView
from agent.wire.prewarm import ItemStatus
from agent.wire.sharing import requested_config

__all__ = ["NodePreview", "action_for", "preview"]

_CANCEL_TIMEOUT_S = 5.0


def mig_config(record: RolloutRecord, node: str) -> tuple[str, str]:
    """The config file and name a node gets: one for all, or its own from a fleet plan."""
    spec = record.spec
    configs: Mapping[str, str] | None = spec.get("configs")
    text = configs[node] if configs is not None else spec["config_yaml"]
    return text, spec["config_name"]


def sharing_request(record: RolloutRecord, node: str) -> sharing_pb2.SetSharingRequest:
    request = json_format.ParseDict(record.spec["request"], sharing_pb2.SetSharingRequest())
    request.request_id = record.request_id(node)
    return request


def prewarm_targets(record: RolloutRecord) -> list[prewarm_pb2.PrewarmTarget]:
    return [json_format.ParseDict(t, prewarm_pb2.PrewarmTarget()) for t in record.spec["targets"]]


async def _follow(client: AgentClient, op: OperationView, notes: Notes) -> OperationView:
    """Watch an operation to its end, reporting progress; cancel it when the node timed out."""
    notes.operation(op.name)
    last = op
    try:
        async for last in client.watch_operation(op.name):
            notes.progress(last.progress)
    except asyncio.CancelledError:
        if notes.timed_out:
            with contextlib.suppress(AgentError, TimeoutError):
                await asyncio.wait_for(client.cancel_operation(op.name), _CANCEL_TIMEOUT_S)
        raise
    return last


@dataclass
class _Base:
    fleet: Fleet
    targets: Mapping[str, Target]
    record: RolloutRecord
    #: who claims each node before changing it ("" claims nothing; agent.coordinator.rollout.claims)
    holder: str = ""
    #: the nodes whose claims count against max-unavailable (default: the record's)
    scope: Mapping[str, Target] | None = None

    def client(self, node: str) -> AgentClient:
        return self.fleet.client(self.targets[node])


class MigApply(_Base):
    _reads: claims.ClaimReads | None = None

    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        if not self.holder:
            return await self._apply(node, notes)
        scope = {**(self.scope or {}), **self.targets}
        if self._reads is None:  # one per rollout: a wave's nodes share their claim reads
            self._reads = claims.ClaimReads(self.fleet, scope)
        await claims.hold(
            self.fleet, scope, self.record, node, self.holder, notes, reads=self._reads
        )
        try:  # planned once claimed: another's change may have made it unchanged meanwhile
            return await self._apply(node, notes)
        finally:  # an apply bound the claim to its operation: the agent ends it with that
            await claims.release(self.fleet, self.targets[node], self.holder)

    async def _apply(self, node: str, notes: Notes) -> NodeResult:
        client = self.client(node)
        text, name = mig_config(self.record, node)
        try:
            plan = await client.plan_mig(text, name)
        except Unrolled:  # the apply retries the failed rollback first, and may get past it
            return await self._run(client, node, notes, text, name)
        statuses = {g.status for g in plan.gpus}
        lost = _not_answering(plan)
        if lost and statuses <= {"unchanged"}:  # the GPUs read hold it; the lost cannot be asked
            return NodeResult(NodeState.FAILED, f"not applied: {lost}")
        if not plan.gpus:  # nothing to plan is not "as asked": the agent's assert says which
            unheld = await _selects_none(client, text, name)
            if unheld:
                return NodeResult(NodeState.FAILED, f"not applied: {unheld}")
        if statuses <= {"unchanged"}:
            return NodeResult(NodeState.UNCHANGED, "already as asked")
        refused = [
            f"GPU {g.gpu_index}: {g.status} "
            f"{g.infeasible_reason or '; '.join(f'{b.pid} on {b.instance}' for b in g.blockers)}"
            for g in plan.gpus
            if g.status in ("blocked", "infeasible")
        ]
        if refused:
            return NodeResult(NodeState.FAILED, "not applied: " + "; ".join(refused))
        return await self._run(client, node, notes, text, name)

    async def _run(
        self, client: AgentClient, node: str, notes: Notes, text: str, name: str
    ) -> NodeResult:
        """Apply on the node and follow it to its end: what the node holds then."""
        op = await client.apply_mig(
            text, name, self.record.request_id(node), claim_holder=self.holder
        )
        final = await _follow(client, op, notes)
        applied = final.mig_result  # also kept by an apply failed for a GPU pending or lost
        if applied is None:
            if final.state != "succeeded":
                return NodeResult(NodeState.FAILED, final.failure)
            return NodeResult(NodeState.SUCCEEDED, "0 GPU(s) changed")
        changed = f"{len(applied.changed_gpu_uuids)} GPU(s) changed"
        # A GPU pending or lost: the others were applied; the node does not hold the config
        # (an agent before the failed_response called such an apply succeeded).
        pending = [
            g.message.replace(_PENDING + "; ", "") for g in applied.gpus if g.status == "pending"
        ]
        why = [f"{_PENDING}: {'; '.join(pending)}"] if pending else []
        # A lost GPU, and an unread one as the agent said it (naming the failing call)
        gone = "; ".join(
            g.message if g.status == "unread" else _lost([g.gpu_index])
            for g in applied.gpus
            if g.status in NOT_ANSWERING
        )
        why += [gone] if gone else []
        if why:
            return NodeResult(NodeState.FAILED, f"{changed}; {'; '.join(why)}")
        if final.state != "succeeded":
            return NodeResult(NodeState.FAILED, final.failure)
        if applied.assert_mismatches:  # planned a GPU, then found none selected
            return NodeResult(NodeState.FAILED, f"not applied: {_NONE_SELECTED}")
        return NodeResult(NodeState.SUCCEEDED, changed)


_PENDING = "MIG mode change pending"
_NONE_SELECTED = "the config selects no GPU of this node"


def _lost(indices: Sequence[int]) -> str:
    """The lost GPUs a config selects, in words ("" for none)."""
    return "; ".join(f"GPU {i} is lost: not applied" for i in indices)


def _not_answering(plan: MigPlanView) -> str:
    """The lost GPUs and those that answer but cannot be read (with the failing call) a plan
    leaves out, in words ("" for none). An agent from before ``unread_gpus`` lists both in
    ``lost_gpus``."""
    said = [_lost(plan.lost_gpus)] if plan.lost_gpus else []
    said += [f"GPU {i} cannot be read ({why}): not applied" for i, why in plan.unread_gpus]
    return "; ".join(said)


async def _selects_none(client: AgentClient, text: str, name: str) -> str:
    """Why a config the node plans no GPU for is not held there, in words ("" when the agent's
    assert finds it held: e.g. a node of no MIG-capable GPU). Its apply would change nothing
    and say so only on stderr (the single-node apply's ``assert_mismatches``)."""
    held = await client.assert_mig(text, name)
    if held.applied:
        return ""
    return f"{_NONE_SELECTED} ({'; '.join(held.mismatches)})"


class ShareApply(_Base):
    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        change = await self.client(node).set_sharing(sharing_request(self.record, node))
        return share_result(change.changed, change.reload)


def share_result(changed: bool, reload: ReloadReport | None) -> NodeResult:
    """A node's SetSharing outcome: a config the plugin was not made to load (a reload that
    did not reach it, method other than ``none``) is not in effect: failed, never succeeded.
    Unchanged with a report: the file said it already, and the plugin was reloaded again."""
    if reload is not None and not reload.done and reload.method != "none":
        what = "written" if changed else "already written"
        return NodeResult(NodeState.FAILED, f"{what}, not reloaded: {reload.detail}")
    if not changed:
        if reload is not None:
            return NodeResult(
                NodeState.SUCCEEDED,
                f"already written; the plugin had not loaded it: {reload.detail}",
            )
        return NodeResult(NodeState.UNCHANGED, "already as asked")
    return NodeResult(NodeState.SUCCEEDED, (reload.detail if reload else "") or "config written")


class PowerApply(_Base):
    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        spec = self.record.spec["spec_yaml"]
        done = await self.client(node).apply_power(spec, self.record.request_id(node))
        # the lost GPUs the spec is for are capped by the agent once they answer: said
        later = "".join(f"; GPU {g.index} lost: capped when it answers" for g in done.lost)
        later += "".join(f"; GPU {g.index} not read: capped once it is" for g in done.unread)
        if not done.changes:
            return NodeResult(NodeState.UNCHANGED, "already as asked" + later)
        return NodeResult(NodeState.SUCCEEDED, f"{len(done.changes)} GPU(s) capped{later}")


class PrewarmApply(_Base):
    async def __call__(self, node: str, notes: Notes) -> NodeResult:
        client = self.client(node)
        op = await client.submit_prewarm(prewarm_targets(self.record), self.record.request_id(node))
        final = await _follow(client, op, notes)
        if final.state != "succeeded":
            return NodeResult(NodeState.FAILED, final.failure)
        return prewarm_result(final.prewarm_result)


def prewarm_result(items: Sequence[ItemStatus]) -> NodeResult:
    """A node's prewarm outcome from its items: failed if any is not ready; ready images whose
    data is not all on the node (a Nydus image pulled without Dragonfly) are named, since the
    pod would still fetch that data."""
    bad = [f"{i.name}: {i.error}" for i in items if not i.ready]
    if bad:
        return NodeResult(NodeState.FAILED, "; ".join(bad))
    detail = f"{len(items)} item(s) ready"
    cold = [f"{i.name} {i.warmth_word}" for i in items if not i.warm]
    return NodeResult(
        NodeState.SUCCEEDED, f"{detail}; not fully warm: {', '.join(cold)}" if cold else detail
    )


_ACTIONS: Mapping[str, Callable[..., NodeAction]] = {
    "mig": MigApply,
    "power": PowerApply,
    "share": ShareApply,
    "prewarm": PrewarmApply,
}


def action_for(
    fleet: Fleet,
    targets: Mapping[str, Target],
    record: RolloutRecord,
    *,
    holder: str = "",
    scope: Mapping[str, Target] | None = None,
) -> NodeAction:
    """The kind's action; with ``holder``, a MIG change claims its node first (claims)."""
    return _ACTIONS[record.kind](fleet, targets, record, holder, scope)


# -- dry runs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePreview:
    """What a rollout would do to one node; ``gpus`` holds the MIG plan per GPU, ``current``
    and ``planned`` the node's sharing now and after the change."""

    node: str
    would: str  # change, unchanged, refused, unknown (the node did not answer)
    detail: str
    gpus: tuple[dict[str, Any], ...] = ()
    current: str = ""
    planned: str = ""


async def _preview_mig(client: AgentClient, record: RolloutRecord, node: str) -> NodePreview:
    text, name = mig_config(record, node)
    plan = await client.plan_mig(text, name)
    gpus = tuple(
        {
            "gpu": g.gpu_index,
            "status": g.status,
            "keep": list(g.keep),
            "destroy": list(g.destroy),
            "create": list(g.create),
            "blockers": [f"{b.pid} on {b.instance} ({b.change})" for b in g.blockers],
            "reason": g.infeasible_reason,
            "deferred": g.deferred,
        }
        for g in plan.gpus
    )
    statuses = {g["status"] for g in gpus}
    gone = _not_answering(plan)
    unheld = "" if gpus or gone else await _selects_none(client, text, name)
    # A mode a VM reboot applies stays pending whatever an apply does: the node cannot succeed.
    reboot = [g.gpu_index for g in plan.gpus if g.mode_pending == REBOOT_APPLIES]
    if statuses & {"blocked", "infeasible"} or gone or unheld or reboot:
        would = "refused"
    else:
        would = "unchanged" if statuses <= {"unchanged"} else "change"
    changing = sum(g["status"] != "unchanged" for g in gpus)
    said = [f"{changing}/{len(gpus)} GPU(s) change"]
    said += [gone] if gone else []
    said += [unheld] if unheld else []
    said += [
        f"{_PENDING}: {g.mode_pending} applies it on GPU {g.gpu_index}"
        for g in plan.gpus
        if g.mode_pending
    ]
    return NodePreview(node, would, "; ".join(said), gpus)


async def _preview_share(client: AgentClient, record: RolloutRecord, node: str) -> NodePreview:
    requested = requested_config(sharing_request(record, node))
    now, inventory = await asyncio.gather(client.get_sharing(), client.node())
    unread = inventory.driver.why_not
    if unread is not None:  # no GPU read is not "no GPU": the agent's SetSharing refuses it
        raise DriverNotReady(f"{node}: a sharing check needs the node's GPUs read: {unread}")
    current = now.config if now.exists else None
    if now.dra is not None:  # the agent renders DeviceClasses there, by the driver's rules
        return dra_sharing_preview(node, requested, current, now.dra)
    if inventory.allocation.mode is AllocationMode.UNKNOWN:  # the agent's SetSharing refuses
        raise Conflict(
            f"{node}: allocation mode {inventory.allocation.describe()}: the agent changes no "
            "sharing until it knows whether a device plugin or a DRA driver hands out its GPUs"
        )
    # Checked against the GPUs that answer and were read, as the agent's SetSharing checks it.
    layouts = [g.layout for g in inventory.gpus if not (g.lost or g.unread or g.never_read)]
    found = sharing_preview(node, requested, current, layouts)
    written = now.last_write  # None: not the agent's write, which its set would not reload
    if found.would != "unchanged" or written is None:
        return found
    method = written.reload.method if written.reload is not None else ""
    if method == "none":
        return found  # something else reloads the plugin: the agent's set would not
    # The agent's own rule, on what it answered: does its set of this config reload again?
    if not reload_again(now.pickup, written, written.sha256, by_signal=method == "sighup"):
        return found
    detail = f"{found.detail}; written, not loaded: {now.pickup.detail}"  # the set reloads it
    return dataclasses.replace(found, would="change", detail=detail)


def sharing_preview(
    node: str,
    requested: PluginConfig,
    current: PluginConfig | None,
    layouts: Sequence[GpuLayout],
) -> NodePreview:
    """What SetSharing of ``requested`` would do on a node whose config file is ``current``
    (None: no file) and whose GPUs are ``layouts``: the agent's own steps on paper (lay the
    request over the file, check it against the GPUs, compare), for a spec and a whole file
    (-f) alike."""
    base = current if current is not None else PluginConfig()  # the agent's view of no file
    was = describe_sharing(base) + ("" if current is not None else " (no config file)")
    planned = merge(base, requested)
    will = describe_sharing(planned)
    found = violations(planned, layouts)
    if found:
        why = "; ".join(map(str, found))
        return NodePreview(node, "refused", f"now: {was}; refused: {why}", (), was, will)
    if planned == base:
        return NodePreview(node, "unchanged", f"now: {was}", (), was, will)
    changed = _changed_keys(to_document(base), to_document(planned))
    detail = f"now: {was}; planned: {will}"
    if changed:
        detail += f" (changes {', '.join(changed)})"
    return NodePreview(node, "change", detail, (), was, will)


def dra_sharing_preview(
    node: str, requested: PluginConfig, current: PluginConfig | None, now: DraView
) -> NodePreview:
    """What SetSharing of ``requested`` would do on a DRA node whose agent holds the spec
    ``current`` (None: none set) and reports its DeviceClasses as ``now``: the spec replaces
    the node's (nothing merged), refused where the driver cannot take it (`dra.plan`), and a
    change when the spec differs or one of its classes is not as set."""
    base = current if current is not None else PluginConfig()
    was = describe_sharing(base) + ("" if current is not None else " (nothing set)")
    planned = PluginConfig(sharing=requested.sharing, flags=requested.flags)
    will = describe_sharing(planned)
    try:
        names = {shared.name for shared in dra.plan(requested, now.allocation).classes}
    except InvalidSpec as exc:
        why = "; ".join(map(str, exc.violations)) or str(exc)
        return NodePreview(node, "refused", f"now: {was}; refused: {why}", (), was, will)
    edited = sorted(o.name for o in now.objects if o.state == "differs" and o.name in names)
    if edited:  # the agent refuses these (`dra.reconcile_one`): no agent overwrites a class
        why = (
            f"DeviceClass {', '.join(edited)} was edited since an agent created it: delete it "
            "(kubectl delete deviceclass NAME) and set again"
        )
        return NodePreview(node, "refused", f"now: {was}; refused: {why}", (), was, will)
    if planned == base and all(o.state == "present" for o in now.objects):
        return NodePreview(node, "unchanged", f"now: {was}", (), was, will)
    return NodePreview(node, "change", f"now: {was}; planned: {will}", (), was, will)


def describe_sharing(config: PluginConfig) -> str:
    """``time-slicing nvidia.com/gpu x4``, ``none``, with the plugin flags sharing depends on."""
    active = config.sharing.active
    text = "none"
    if active is not None:
        resources = ", ".join(f"{r.name} x{r.replicas}" for r in active.resources)
        text = f"{config.sharing.strategy} {resources}"
    notes = [f"migStrategy {config.flags.mig_strategy}"] if config.flags.mig_strategy else []
    if active is not None and active.rename_by_default:
        notes.append("renameByDefault")
    return f"{text} ({', '.join(notes)})" if notes else text


def _changed_keys(before: Mapping[str, Any], after: Mapping[str, Any], at: str = "") -> list[str]:
    """The dotted keys whose values differ, e.g. ``sharing.timeSlicing.resources``."""
    changed = []
    for key in sorted(set(before) | set(after), key=str):
        path = f"{at}.{key}" if at else str(key)
        old, new = before.get(key), after.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changed += _changed_keys(old, new, path)
        elif old != new:
            changed.append(path)
    return changed


async def _preview_power(client: AgentClient, record: RolloutRecord, node: str) -> NodePreview:
    """The agent's own check on paper: the spec against each GPU's range (agent.power.plan)."""
    view = await client.get_power()
    gpus = list(view.gpus)
    spec_yaml = record.spec["spec_yaml"]
    targets, problems = resolve(parse_power(spec_yaml), gpus)
    if problems:
        why = "; ".join(map(str, problems))
        return NodePreview(node, "refused", why)
    changing = [t for t in targets if t.changes]
    if not changing and view.spec_text == spec_yaml:
        return NodePreview(node, "unchanged", f"{len(targets)} GPU(s) capped as asked")
    return NodePreview(node, "change", f"{len(changing)}/{len(gpus)} GPU(s) change")


async def _preview_prewarm(client: AgentClient, record: RolloutRecord, node: str) -> NodePreview:
    """Unchanged when every target's item is warm and is that target's; refused, as the
    node's agent would refuse it, where its name holds another source's item."""
    held = {i.name: i for i in (await client.node()).cache}
    targets = prewarm_targets(record)
    names = [target_name(t) for t in targets]
    refused = [
        why
        for t, n in zip(targets, names, strict=True)
        if n in held and (why := held_elsewhere(t, held[n])) is not None
    ]
    if refused:
        return NodePreview(node, "refused", "; ".join(refused))
    missing = [n for n in names if not n or n not in held or not held[n].warm]
    if not missing:
        return NodePreview(node, "unchanged", "every item is warm")
    return NodePreview(node, "change", f"{len(missing)}/{len(names)} item(s) to fetch")


_PREVIEWS = {
    "mig": _preview_mig,
    "power": _preview_power,
    "share": _preview_share,
    "prewarm": _preview_prewarm,
}


async def preview(
    fleet: Fleet, targets: Mapping[str, Target], record: RolloutRecord
) -> list[NodePreview]:
    """Every node's plan, read-only, in rollout order; a node that cannot answer says why."""
    show = _PREVIEWS[record.kind]
    nodes = list(record.nodes)

    async def one(node: str) -> NodePreview:
        try:
            return await show(fleet.client(targets[node]), record, node)
        except AgentError as exc:
            return NodePreview(node, "unknown", str(exc))

    return list(await asyncio.gather(*(one(n) for n in nodes)))
