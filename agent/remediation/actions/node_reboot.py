"""node_reboot: the ladder's third step, a reboot through the scheduler, proven by the boot time and the GPUs.

Why through Slurm (`scontrol reboot ASAP nextstate=RESUME`): Slurm drains the node, waits for its jobs to end,
runs its RebootProgram and returns the node to service itself; the agent never power-cycles a node under a
job. The proof is not the request: it is Slurm's BootTime later than the one planned, the node back in
service, and the GPUs healthy (`verify`, the engine's NVML health read) within `verify_seconds`. Anything
short of that fails the step, and the ladder escalates (gpu_service_required). A reboot cannot be undone;
after a crash (the agent's own node may have been the one rebooting) the boot time says whether it happened.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any, Awaitable, Callable, Mapping

from . import ActionError, ActionResult
from .drain import MARKER, checkpoint_jobs, jobs_on
from .slurm import DRAINED_WORDS, SchedulerError, UnknownNode

Verify = Callable[[str], Awaitable[tuple[bool, str]]]  # node -> (GPUs healthy, why in words)
POLL_SECONDS = 1.0


def _later(now: float | None, before: float | None) -> bool:
    """The node booted after `before` (None: Slurm showed no boot time then, so any boot time is later)."""
    return now is not None and (before is None or now > before)


def _when(t: float | None) -> str:
    return "none" if t is None else datetime.fromtimestamp(t).isoformat(timespec="seconds")


def _reboot_pending(state: str) -> bool:
    """sinfo's %T while Slurm holds a reboot: `reboot^` (issued), a `@` flag (requested), `booting`."""
    return "boot" in state or "@" in state or "^" in state


def _in_service(state: str) -> bool:
    """Back after the boot: not drained, down or failed, and no reboot still requested or issued."""
    return not _reboot_pending(state) and not any(w in state for w in DRAINED_WORDS)


class NodeRebootAction:
    kind = "node_reboot"

    def __init__(self, scheduler: Any, verify: Verify, timeout_seconds: float, verify_seconds: float,
                 poll_seconds: float = POLL_SECONDS, checkpoint_signal: str | None = None):
        self.scheduler = scheduler
        self.checkpoint_signal = checkpoint_signal  # as before a drain: the jobs checkpoint, then Slurm reboots
        self.verify = verify
        self.timeout_seconds = timeout_seconds
        self.verify_seconds = verify_seconds
        self.poll_seconds = poll_seconds

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        node = target["node"]
        try:
            boot = await self.scheduler.boot_time(node)
            st = await self.scheduler.state(node)
        except UnknownNode as exc:
            raise ActionError(str(exc), permanent=True) from exc
        except SchedulerError as exc:
            raise ActionError(f"cannot read {node}'s boot time: {exc}", guardrail="scheduler_unreachable") from exc
        reason = f"{MARKER} {ctx.get('incident_id', '?')} {ctx.get('detector', '')}".strip()
        return {"before": {"boot_time": boot, "state": st.state, "reason": st.reason}, "reason": reason,
                **await jobs_on(self.scheduler, node)}

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult:
        node, before = target["node"], dict(plan["before"])
        booted_before = before.get("boot_time")
        checkpoint: dict[str, str] = {}
        try:
            if not _later(await self.scheduler.boot_time(node), booted_before):  # a retry after the boot: verify only
                # `reboot ASAP` waits for the node's jobs to end: they get their checkpoint signal first, as on a drain
                checkpoint = await checkpoint_jobs(self.scheduler, node,
                                                   params.get("checkpoint_signal", self.checkpoint_signal))
                await self.scheduler.reboot(node, str(plan["reason"]))
        except SchedulerError as exc:
            raise ActionError(f"reboot {node}: {exc}") from exc
        boot, state = await self._wait_back(node, booted_before)
        ok, why = await self._verify(node)
        after = {"boot_time_before": booted_before, "boot_time": boot, "state": state, "verify": why, **checkpoint}
        if not ok:
            raise ActionError(f"{node} rebooted (BootTime {_when(boot)}) but its GPUs are not healthy "
                              f"within {self.verify_seconds:g} s: {why}")
        return ActionResult(True, f"{node} rebooted (BootTime {_when(booted_before)} -> {_when(boot)}), {state}, "
                                  f"GPUs healthy: {why}", before=before, after=after)

    async def _wait_back(self, node: str, booted_before: float | None) -> tuple[float | None, str]:
        """(boot time, state) once Slurm shows the node booted after the plan and back in service."""
        deadline = time.monotonic() + self.timeout_seconds
        seen = "nothing read yet"
        while True:
            try:
                boot, st = await self.scheduler.boot_time(node), await self.scheduler.state(node)
                if _later(boot, booted_before) and _in_service(st.state):
                    return boot, st.state
                seen = f"BootTime {_when(boot)} (before: {_when(booted_before)}), state {st.state}"
            except SchedulerError as exc:  # slurmctld busy or restarting: the deadline decides, not one answer
                seen = f"scheduler: {exc}"
            if time.monotonic() >= deadline:
                raise ActionError(f"{node} not back from its reboot within {self.timeout_seconds:g} s: last seen {seen}")
            await asyncio.sleep(self.poll_seconds)

    async def _verify(self, node: str) -> tuple[bool, str]:
        """The GPU health read, repeated until it passes or `verify_seconds` are spent (drivers load after boot)."""
        deadline = time.monotonic() + self.verify_seconds
        while True:
            ok, why = await self.verify(node)
            if ok or time.monotonic() >= deadline:
                return ok, why
            await asyncio.sleep(self.poll_seconds)

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult:
        return ActionResult(True, "a reboot cannot be undone", skipped=True)

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        """After a crash: booted since the plan, or a reboot still pending in Slurm -> applied."""
        node = target["node"]
        try:
            boot, st = await self.scheduler.boot_time(node), await self.scheduler.state(node)
        except SchedulerError:
            return "unknown"
        if _later(boot, plan.get("before", {}).get("boot_time")) or _reboot_pending(st.state):
            return "applied"
        return "not_applied"
