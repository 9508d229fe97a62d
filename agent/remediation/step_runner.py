"""Running a playbook: every step on each of its targets, through the guardrails, intent before the write.

Why apart: this is the order that must hold under crashes and concurrency (guardrail place held from check to
result, approval, plan, intent on disk, the write, its result), and one step's failure never cancels another.
Part of RemediationEngine (agent/remediation/engine.py), which holds the state.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Mapping

from agent.drill.plan import drill_dry_run, drill_mark

from .actions import ActionError, ActionResult, parse_target, target_str
from .blast import SCHEDULER_UNREACHABLE, check_drain
from .guardrails import Reservation
from .incidents import Incident
from .settings import Hold
from .ownership import carry_ownership
from .playbooks import Playbook, Step
from .recovery_ledger import RECOVERY_ACTIONS, Recovery
from .steps import action_id, error_text, outcome, run_graph

log = logging.getLogger("supernode.remediation")

# Step targets on shared rack devices: the rack leader drives them.
SHARED_TARGETS = ("valve", "rack_valve", "outlets")

COORDINATION_LOST = "coordination_lost"  # guardrail and approval key of a shared step queued while degraded

# Set while a person approved a queued shared step in degraded mode: its write goes out without a leader's fence.
UNFENCED: contextvars.ContextVar[bool] = contextvars.ContextVar("supernode_unfenced", default=False)


class StepRunner:
    """Part of RemediationEngine: see the module docstring."""

    drill_real: frozenset[str] | None = None  # the running drill's real actions (agent.drill); None: the default

    async def run_playbook(self, inc: Incident, book: Playbook) -> None:
        """All steps at once in urgency order (`after:` waits), then the truthful outcome (steps.outcome)."""
        self.incidents.transition(inc, "mitigating")
        results = await run_graph(book.steps, lambda idx, step: self._run_step_targets(inc, book, idx, step))
        if inc.state != "resolved":
            inc.detail["steps"] = {f"{i}:{s.action}": r for i, (s, r) in enumerate(zip(book.steps, results))}
            self.incidents.transition(inc, outcome(book.steps, results, book.effective_mode(self.mode)))

    async def _run_step_targets(self, inc: Incident, book: Playbook, idx: int, step: Step) -> list[str]:
        """One step on each of its targets; a target list that cannot be read is a failed step, said why."""
        if inc.state == "resolved":
            return []
        if step.targets in SHARED_TARGETS and self.rack.role() == "follower" and self.rack.leader_node() is None:
            # Followers leave shared devices to the leader; with none, nobody would drive them: say so.
            self._block(inc, book, step, action_id(inc.id, idx, ""), "", "no_leader",
                        "the rack has no leader now: the agent elected next carries this step on")
            return ["blocked"]
        try:
            targets = await self.resolve_targets(step.targets, inc)
        except Exception as exc:  # ActionError (a device count), or a bug: this step fails, said why; no other
            return [self._result(inc, book, step, action_id(inc.id, idx, ""), "", "failed",
                                 {"phase": "apply", "error": f"targets: {error_text(exc)}"})]
        return list(await asyncio.gather(*(self._run_step_isolated(inc, book, idx, step, tgt) for tgt in targets)))

    async def _run_step_isolated(self, inc: Incident, book: Playbook, idx: int, step: Step,
                                 target: Mapping[str, str]) -> str:
        """One step on one target, ending in its own recorded outcome whatever goes wrong inside it.

        Why: the steps of a playbook run together (a leak drains and caps at once); an exception from
        coordination (a value read from etcd), a device adapter or a bug in one of them used to propagate and
        cancel its siblings, so a bad record in etcd took the leak's GPU caps with the drain."""
        try:
            return await self.run_step(inc, book, idx, step, target)
        except Exception as exc:
            tgt = target_str(target)
            log.exception("remediation step failed", extra={"incident": inc.id, "action": step.action,
                                                             "target": tgt})
            return self._result(inc, book, step, action_id(inc.id, idx, tgt), tgt, "failed",
                                {"phase": "apply", "error": error_text(exc), "exception": type(exc).__name__})

    def _block(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, guardrail: str,
               why: str = "", phase: str = "apply") -> None:
        self.journal.append("blocked", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result="blocked", detail={"guardrail": guardrail, "why": why, "phase": phase})
        self.blocked_total[(book.name, guardrail)] = self.blocked_total.get((book.name, guardrail), 0) + 1
        self._count(book.name, step.action, "blocked")

    async def _reserve(self, inc: Incident, book: Playbook, step: Step,
                       target: Mapping[str, str]) -> Reservation | tuple[str, str]:
        """The step's place in the guardrails when it may run now, else (guardrail, why in words).

        Why a place is held: the checks that await (the scheduler's count, etcd) and everything after them
        (plan, approval, the intent on disk) let other steps be checked meanwhile; they count this one."""
        g, tgt = self.guard, target_str(target)
        name = g.check_breaker() or g.check_rate(step.action) or g.check_cooldown(step.action, tgt)
        if name:
            return name, g.why(name, step.action, tgt)
        node = self._node_of(target)
        if self.maintenance.active(node):
            return "maintenance", self.maintenance.why(node)
        held = g.reserve(step.action, tgt)  # no await since the checks above
        try:
            blocked = None
            if step.action == "drain" and self.executors.scheduler is not None:
                blocked = await check_drain(self.executors.scheduler, g, self.inventory.nodes, target["node"],
                                            self.rack, held)
            blocked = blocked or await self.rack.reserve_action(step.action, g)  # rack-wide breaker, rates (etcd)
        except BaseException:
            held.release()
            raise
        if blocked:
            held.release()
            return blocked
        return held

    def _retry_later(self, inc: Incident, book: Playbook, idx: int, step: Step, target: Mapping[str, str]) -> float:
        """Run a step blocked by an unreachable scheduler again after a doubling delay, until it runs or the
        incident resolves; the playbook's other steps do not wait for it."""
        aid = action_id(inc.id, idx, target_str(target))
        n = self.retries.get(aid, 0)
        self.retries[aid] = n + 1
        g = self.settings.guardrails
        delay = min(g.retry_backoff_seconds * 2 ** n, g.scheduler_retry_max_seconds)

        async def again() -> None:
            await asyncio.sleep(delay)
            if self.started and inc.state != "resolved":
                await self._run_step_isolated(inc, book, idx, step, target)
        self._spawn(again())
        return delay

    async def run_step(self, inc: Incident, book: Playbook, idx: int, step: Step, target: Mapping[str, str],
                       attempt: str = "") -> str:
        """`attempt` names a re-run of an applied step with new inputs (derate_watch.py: "replan-N"): its own
        action id, the same guardrails, and the effect stays the first apply's (its undo restores the limit
        found before the first)."""
        tgt = target_str(target)
        aid = action_id(inc.id, idx, tgt, attempt) if attempt else action_id(inc.id, idx, tgt)
        last = self.journal.last_result(aid)
        if last is not None and last.result == "unknown":
            # reconciled as unknown (device unreadable at start): acting again blind could take over an
            # effect we cannot see; wait until _recheck_unknown has read the device
            async with self._reconciled:
                await self._reconciled.wait_for(lambda: self.journal.last_result(aid).result != "unknown")
            last = self.journal.last_result(aid)
        if last is not None and last.result in ("done", "dry_run"):
            return "duplicate"
        act = self.actions.get(step.action)
        mode = book.effective_mode(self.mode)
        hold = getattr(self.settings.detectors, inc.detector, None)  # when its condition began (a derate looks back)
        ctx = {"incident_id": inc.id, "detector": inc.detector, **inc.targets,
               **{k: v for k, v in inc.detail.items() if isinstance(v, (int, float, str))},
               "incident_onset_at": inc.opened_at - (hold.fire_seconds if isinstance(hold, Hold) else 0.0)}
        if attempt:
            ctx["attempt"] = attempt
        if act is None and step.action == "notify":  # nobody to tell is a configuration fact, not a guardrail
            return self._result(inc, book, step, aid, tgt, "not_configured",
                                {"phase": "apply", "why": "no remediation.notify_url configured"})
        if act is None:
            self._block(inc, book, step, aid, tgt, "not_configured",
                        f"no executor for {step.action} on this agent (inventory or remediation settings)")
            return "blocked"
        if mode == "observe":
            self._block(inc, book, step, aid, tgt, "mode", "observe mode: the agent records what it would do")
            return "blocked"
        held = await self._reserve(inc, book, step, target)
        if not isinstance(held, Reservation):
            return self._blocked_step(inc, book, idx, step, aid, target, *held)
        try:
            return await self._act(inc, book, idx, step, aid, target, act, mode, ctx, held)
        finally:
            held.release()

    async def _act(self, inc: Incident, book: Playbook, idx: int, step: Step, aid: str, target: Mapping[str, str],
                   act: Any, mode: str, ctx: Mapping[str, Any], held: Reservation) -> str:
        """A step past the guardrails: approval, plan, intent on disk, the write, its result."""
        tgt = target_str(target)
        person_took_it = False
        if step.targets in SHARED_TARGETS and self.rack.role() == "degraded" and mode == "enforce":
            # Coordination lost: no agent can prove it leads. Queue the shared step: it runs here if a
            # person approves it, or goes to the leader when coordination returns.
            if not await self._approve(inc, book, step, aid, tgt, "apply", COORDINATION_LOST):
                self._block(inc, book, step, aid, tgt, COORDINATION_LOST,
                            "coordination lost: queued for a person or the rack leader; not approved here")
                return "blocked"
            person_took_it = True
        if self.guard.needs_approval(step.approval) and mode == "enforce" and not person_took_it:
            if not await self._approve(inc, book, step, aid, tgt, "apply", step.approval or ""):
                self._block(inc, book, step, aid, tgt, "approval", "not approved (expired or resolved)")
                return "blocked"
            if inc.state == "resolved":
                return "blocked"
        try:
            plan = await self._plan(act, target, step.params, ctx)
        except ActionError as exc:
            if exc.guardrail:
                return self._blocked_step(inc, book, idx, step, aid, target, exc.guardrail, str(exc))
            return self._result(inc, book, step, aid, tgt, "failed", {"error": str(exc), "phase": "apply"})
        plan = carry_ownership(plan, self.journal.intent(aid))
        if mode == "dry-run" or drill_dry_run(inc.detail, step.action, self.drill_real):
            return self._result(inc, book, step, aid, tgt, "dry_run", {"plan": plan, "phase": "apply",
                                                                       **drill_mark(inc.detail)})
        seq = self.journal.append("intent", action_id=aid, incident_id=inc.id, playbook=book.name,
                                  action=step.action, target=tgt,
                                  detail={"plan": plan, "params": step.params, "phase": "apply"})
        on_disk = await self._intent_on_disk(seq, aid)
        if self.first_action_at is None:
            self.first_action_at = self.clock()
        token = UNFENCED.set(person_took_it)
        try:
            res = await self._attempt(lambda: act.apply(target, step.params, ctx, plan))
        except ActionError as exc:  # a guardrail only the write itself can check: the leader's fence
            self.blocked_total[(book.name, exc.guardrail or "")] = self.blocked_total.get((book.name, exc.guardrail or ""), 0) + 1
            return self._result(inc, book, step, aid, tgt, "blocked", {"phase": "apply", "guardrail": exc.guardrail,
                                                                       "why": str(exc), "not_applied": True,
                                                                       "intent_on_disk": on_disk})
        finally:
            UNFENCED.reset(token)
        held.commit()
        if isinstance(res, ActionResult):
            if not res.skipped or res.before.get("owned") is False:
                # held under the first apply's id even by a re-run: the undo looks the effect up by that id (a
                # re-run can be an incident's first hold, when its first apply was skipped: another cap had landed)
                self._hold(step.action, tgt, inc.id, action_id(inc.id, idx, tgt), res, step.params)
            rerun = {"rerun_of": action_id(inc.id, idx, tgt)} if ctx.get("attempt") else {}  # ownership.py
            return self._result(inc, book, step, aid, tgt, "done",
                                {"phase": "apply", "message": res.message, "before": res.before, "after": res.after,
                                 "skipped": res.skipped, "params": step.params, "intent_on_disk": on_disk, **rerun})
        return self._result(inc, book, step, aid, tgt, "failed", {"phase": "apply", "error": res, "escalated": True,
                                                                  "intent_on_disk": on_disk})

    async def _intent_on_disk(self, seq: int, aid: str) -> bool:
        """Wait (bounded) until the intent row is committed, so a crash after the write still leaves the
        intent for the restart to reconcile. Why bounded: a slow or full state disk must delay a safety step
        by at most `intent_commit_wait_seconds`, never stop it; past that the step acts and its result says
        `intent_on_disk: false`."""
        if await self.journal.committed(seq, self.settings.intent_commit_wait_seconds):
            return True
        log.warning("acting before the intent reached the disk", extra={
            "action_id": aid, "journal_error": self.journal.last_error,
            "wait_seconds": self.settings.intent_commit_wait_seconds})
        return False

    def _blocked_step(self, inc: Incident, book: Playbook, idx: int, step: Step, aid: str,
                      target: Mapping[str, str], guardrail: str, why: str) -> str:
        if guardrail == SCHEDULER_UNREACHABLE:
            why = f"{why}; retry in {self._retry_later(inc, book, idx, step, target):g} s"
        self._block(inc, book, step, aid, target_str(target), guardrail, why)
        return "blocked"

    def _hold(self, kind: str, tgt: str, incident_id: str, aid: str, res: ActionResult, params: Mapping) -> None:
        eff = self.effects.get((kind, tgt))
        if eff is not None and incident_id in eff["holders"]:  # a re-run of this incident's step: its new value
            if not res.skipped:
                eff["after"] = res.after
            return
        if eff is None:
            if not res.before.get("owned"):
                return  # not ours and nobody of ours holds it: nothing to undo later
            eff = self.effects[(kind, tgt)] = {"before": res.before, "after": res.after, "params": dict(params),
                                               "holders": {}}
        elif not res.skipped:  # another incident set its value over ours (a lower cap): the undo checks for that one
            eff["after"] = res.after
        eff["holders"][incident_id] = aid

    async def _plan(self, act: Any, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        """The step's plan (a read of the device's state), tried like the action itself: a dropped connection
        or one unanswered read before a valve close is retried within the attempt budget, not the end."""
        delay = self.settings.guardrails.retry_backoff_seconds
        for attempt in range(self.settings.guardrails.attempts_per_incident):
            try:
                return await act.plan(target, params, ctx)
            except ActionError as exc:
                if exc.permanent or attempt + 1 >= self.settings.guardrails.attempts_per_incident:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise ActionError("plan: no attempt left")

    async def _attempt(self, call) -> ActionResult | str:
        """Run with retries and backoff inside the attempt budget; returns the result or the last error."""
        delay = self.settings.guardrails.retry_backoff_seconds
        error = ""
        for attempt in range(self.settings.guardrails.attempts_per_incident):
            try:
                return await call()
            except ActionError as exc:
                if exc.guardrail is not None:
                    raise  # refused by a rule of ours at the write (fencing): a block, never retried
                error = str(exc)
                if exc.permanent:
                    break
            except Exception as exc:  # device libraries raise their own types
                error = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.settings.guardrails.attempts_per_incident:
                await asyncio.sleep(delay)
                delay *= 2
        return error or "failed"

    def _result(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, result: str,
                detail: dict[str, Any]) -> str:
        self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result=result, detail=detail)
        self._count(book.name, step.action, result)
        if step.action in RECOVERY_ACTIONS and result in ("done", "failed"):
            # the GPU fault judge's proof of a recovery (or the cause of an escalation): see recovery_ledger.py
            t = parse_target(tgt)
            self.recoveries.record(Recovery(t.get("node", self.identity.node), t.get("gpu"), step.action,
                                            result == "done", self.clock(), str(detail.get("error", ""))))
        return result
