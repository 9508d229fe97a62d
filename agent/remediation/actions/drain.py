"""drain: take a node out of the scheduler with a marked reason; undo only what carries our marker."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from . import ActionError, ActionResult
from .slurm import SchedulerError, UnknownNode

MARKER = "supernode-agent:"
log = logging.getLogger("supernode.remediation")


class DrainAction:
    kind = "drain"

    def __init__(self, scheduler, checkpoint_signal: str | None = None):
        self.scheduler = scheduler
        self.checkpoint_signal = checkpoint_signal

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        try:
            st = await self.scheduler.state(target["node"])
        except UnknownNode as exc:
            raise ActionError(str(exc), permanent=True) from exc
        except SchedulerError as exc:  # the engine retries this step with backoff; the playbook goes on
            raise ActionError(f"cannot read {target['node']}'s state: {exc}", guardrail="scheduler_unreachable") from exc
        reason = f"{MARKER} {ctx.get('incident_id', '?')} {ctx.get('detector', '')}".strip()
        jobs = await jobs_on(self.scheduler, target["node"]) if not st.drained else {}
        return {"before": {"state": st.state, "reason": st.reason, "owned": not st.drained}, "reason": reason, **jobs}

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult:
        node, before = target["node"], dict(plan["before"])
        if not before["owned"]:
            ours = before["reason"].startswith(MARKER)
            return ActionResult(True, f"{node} already {before['state']} ({'by us' if ours else 'by someone else'})",
                                before=before, after={"state": before["state"], "reason": before["reason"]},
                                skipped=True)
        checkpoint = await self._checkpoint(node, params)
        try:
            await self.scheduler.drain(node, plan["reason"])
            after = await self.scheduler.state(node)
        except SchedulerError as exc:
            raise ActionError(str(exc)) from exc
        if not after.drained or not after.reason.startswith(MARKER):
            raise ActionError(f"read-back: {node} is {after.state} reason {after.reason!r} after drain")
        return ActionResult(True, f"{node} {after.state}", before=before,
                            after={"state": after.state, "reason": after.reason, **checkpoint})

    async def _checkpoint(self, node: str, params: Mapping[str, Any]) -> dict[str, str]:
        return await checkpoint_jobs(self.scheduler, node, params.get("checkpoint_signal", self.checkpoint_signal))

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult:
        node = target["node"]
        try:
            st = await self.scheduler.state(node)
            if not before.get("owned", False) or not st.reason.startswith(MARKER):
                return ActionResult(True, f"{node} not resumed: not drained by us (now {st.state}, {st.reason!r})",
                                    after={"state": st.state, "reason": st.reason}, skipped=True)
            if not st.drained:
                return ActionResult(True, f"{node} already {st.state}", after={"state": st.state}, skipped=True)
            await self.scheduler.resume(node)
            now = await self.scheduler.state(node)
        except SchedulerError as exc:
            raise ActionError(str(exc)) from exc
        if "drain" in now.state:
            raise ActionError(f"read-back: {node} still {now.state} after resume")
        return ActionResult(True, f"{node} {now.state}", after={"state": now.state})

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        try:
            st = await self.scheduler.state(target["node"])
        except SchedulerError:
            return "unknown"
        if not plan.get("before", {}).get("owned", True):
            return "applied"  # nothing was to be done
        return "applied" if st.drained and st.reason.startswith(str(plan.get("reason", MARKER))[:40]) else "not_applied"


async def jobs_on(scheduler: Any, node: str) -> dict[str, Any]:
    """The jobs running on a node as the agent is about to take it out (a drain, a reboot), for the plan: the
    intent carries them to the disk before the write, so the goodput report's "jobs interrupted" is what was
    there at that moment, even if the agent dies with its node. A scheduler that cannot say is recorded as
    such (`jobs_error`: the report shows unknown, never 0) and never stops the step."""
    try:
        return {"jobs": sorted(str(j) for j in await scheduler.jobs(node))}
    except Exception as exc:  # SchedulerError, or an adapter's own: the step goes on, the record says unknown
        log.warning("jobs on the node unknown; going on", extra={"node": node, "error": str(exc)})
        return {"jobs_error": f"{type(exc).__name__}: {exc}"}


async def checkpoint_jobs(scheduler: Any, node: str, signal: str | None) -> dict[str, str]:
    """Give the node's jobs their checkpoint signal before the scheduler takes the node (a drain, a reboot);
    a failure is logged and recorded in the result, never blocks the step."""
    if not signal:
        return {}
    try:
        await scheduler.signal_jobs(node, str(signal))
    except SchedulerError as exc:
        log.warning("checkpoint signal failed; going on", extra={"node": node, "signal": signal, "error": str(exc)})
        return {"checkpoint_error": str(exc)}
    return {"checkpoint_signal": str(signal)}
