"""job_notify: tell the jobs on a node that an application-level GPU fault hit them (the ladder's first step).

Why not a drain: the catalogue's RESTART_APP XIDs (13, 31, 43, ...) say the application, not the GPU, is at
fault, so the node stays in service and the job's owner is told: a Comment they see in squeue/sacct
(`comment`), or the job is put back in the queue (`requeue`), or only the journal records it (`none`); the
mode is `remediation.gpu_recovery.job_notify`, a step param `how` overrides it. Nothing to undo: a comment or
a requeue is information, not a state the agent holds.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import ActionError, ActionResult
from .drain import MARKER
from .slurm import SchedulerError, UnknownNode

MODES = ("comment", "requeue", "none")


def _first(ctx: Mapping[str, Any], *keys: str, default: str = "?") -> str:
    """The first of `keys` the incident detail carries (the detectors name things their own way)."""
    return next((str(ctx[k]) for k in keys if ctx.get(k) not in (None, "")), default)


def comment_text(node: str, ctx: Mapping[str, Any]) -> str:
    """What the job's owner reads: ours (the drain MARKER), the incident, and the catalogue's verdict."""
    xid = _first(ctx, "xid", "code")
    mnemonic = _first(ctx, "mnemonic", "xid_name", default="")
    action = _first(ctx, "immediate_action", "catalogue_action", "action", default="RESTART_APP")
    return (f"{MARKER} {ctx.get('incident_id', '?')} node {node} gpu {_first(ctx, 'gpu')} "
            f"XID {xid}{f' ({mnemonic})' if mnemonic else ''}: catalogue action {action}")


class JobNotifyAction:
    kind = "job_notify"

    def __init__(self, scheduler: Any, mode: str = "comment"):
        if mode not in MODES:
            raise ValueError(f"remediation.gpu_recovery.job_notify: {mode!r} is not one of {MODES}")
        self.scheduler = scheduler
        self.mode = mode

    def _how(self, params: Mapping[str, Any]) -> str:
        how = str(params.get("how", self.mode))
        if how not in MODES:
            raise ActionError(f"job_notify: param how={how!r} is not one of {MODES}", permanent=True)
        return how

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        node = target["node"]
        how = self._how(params)
        try:
            jobs = await self.scheduler.jobs(node)
        except UnknownNode as exc:
            raise ActionError(str(exc), permanent=True) from exc
        except SchedulerError as exc:
            raise ActionError(f"cannot list {node}'s jobs: {exc}", guardrail="scheduler_unreachable") from exc
        return {"before": {"jobs": jobs}, "how": how, "text": comment_text(node, ctx)}

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult:
        node, how, jobs = target["node"], str(plan["how"]), list(plan["before"]["jobs"])
        if not jobs:
            return ActionResult(True, f"no running job on {node}: nobody to tell", before=dict(plan["before"]),
                                after={"jobs": [], "done": "nothing"}, skipped=True)
        if how == "none":
            return ActionResult(True, f"job_notify none: {len(jobs)} job(s) on {node} journaled only",
                                before=dict(plan["before"]), after={"jobs": jobs, "done": "none"}, skipped=True)
        done, errors = [], []
        for job in jobs:  # each job is told even if another fails (it may have ended meanwhile)
            try:
                if how == "comment":
                    await self.scheduler.comment_job(job, str(plan["text"]))
                else:
                    await self.scheduler.requeue_job(job)
                done.append(job)
            except SchedulerError as exc:
                errors.append(f"job {job}: {exc}")
        if not done:
            raise ActionError(f"job_notify {how} on {node}: " + "; ".join(errors))
        after = {"jobs": jobs, "done": how, "told": done, "errors": errors}
        return ActionResult(True, f"{how} {', '.join(done)} on {node}" + (f"; {'; '.join(errors)}" if errors else ""),
                            before=dict(plan["before"]), after=after)

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult:
        return ActionResult(True, "job_notify has nothing to undo (the job was told)", skipped=True)

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        """After a crash: applied when there was nothing to do, or a planned job carries our comment."""
        jobs = list(plan.get("before", {}).get("jobs", []))
        if not jobs or plan.get("how") == "none":
            return "applied"
        if plan.get("how") != "comment":
            return "unknown"  # a requeued job looks like any pending one: nothing of ours to read back
        try:
            comments = [await self.scheduler.job_comment(job) for job in jobs]
        except SchedulerError:
            return "unknown"
        return "applied" if any(c == plan.get("text") for c in comments) else "not_applied"
