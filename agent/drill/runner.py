"""Runs one drill inside the agent: checks the plan against the rack and its jobs, injects the fault, lets the
engine handle it as a real one, does the drill's scheduler steps (approvals of dry-run steps, the requeue of its
own jobs), then ends the fault and waits for the engine's undo.

Why the drill approves: a dry-run step's approval is still asked (journaled, shown as pending) so the drill
proves the approval path; the drill answers it since nothing is written. The undo's approvals
(`resume_after_leak`) are answered by the drill too: the person who started it with the admin token ordered
the undo with it. Every row the drill writes is a journal row of kind `drill`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agent import __version__

from .job_check import JobEvents, job_events
from .plan import ACTION_STAGE, DRILL_SAFE, DrillPlan, PlanError, check_against_inventory
from .scenarios import describe, mitigation, rack_of
from .report import build_report, is_undo
from .source import DrillSource

log = logging.getLogger("supernode.drill")
POLL = 0.2


class DrillRefused(Exception):
    """The drill did not start; the message says why (a plan field, a foreign job, a drill already running)."""


class DrillRunner:
    """At most one drill at a time per agent. `hook` is the remediation hook (its engine may be swapped)."""

    def __init__(self, store: Any, hook: Any):
        self.store, self.hook = store, hook
        self.plan: DrillPlan | None = None
        self.state = "idle"  # idle | running | ending | passed | failed | aborted
        self.started_at: float | None = None
        self.start_seq = 0
        self.facts: dict[str, Any] = {}
        self.source: DrillSource | None = None
        self._task: asyncio.Task | None = None
        self._abort = asyncio.Event()
        self.report: dict[str, Any] | None = None
        self._page_report: tuple[float, dict[str, Any] | None] = (0.0, None)

    @property
    def engine(self) -> Any:
        return self.hook.engine

    @property
    def active(self) -> bool:
        return self.state in ("running", "ending")

    async def start(self, plan: DrillPlan, who: str, allow_jobs: bool = False) -> dict[str, Any]:
        if self.active:
            raise DrillRefused(f"drill {self.plan.name} is running: wait for it or `drill --abort`")  # type: ignore
        eng = self.engine
        try:
            rack = rack_of(eng.inventory, eng.identity.node, eng.settings.leak_scope.watch_below_trays)
            check_against_inventory(plan, rack)
            judge = eng.detectors.gpu_faults
            acts_by = mitigation(plan.scenario, lambda code: judge.rules.class_of(
                judge.entries.get(code), judge.actions_of(code)[0])[0])
            if plan.job is not None and acts_by != "drain":
                raise PlanError(f"job: a {describe(plan.scenario)} drains no node, so no job is moved: leave job out")
            source = DrillSource(self.store, plan, rack)
        except (PlanError, ValueError) as exc:
            raise DrillRefused(str(exc)) from None
        jobs = await self._jobs_on(plan, allow_jobs)
        self.plan, self.source, self.state, self.report = plan, source, "running", None
        self._page_report = (0.0, None)
        self._abort = asyncio.Event()
        self.started_at = time.time()
        self.facts = {"jobs": jobs, "requeued": {}, "by": who, "versions": self._versions(), "acts_by": acts_by}
        eng.drill_real = plan.real_actions()
        self.start_seq = eng.journal.append("drill", result="injected", target=",".join(plan.nodes), detail={
            "drill": True, "plan": plan.model_dump(mode="json"), "by": who, "jobs": jobs, "allow_jobs": allow_jobs},
            ts=self.started_at)
        source.start()
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name="drill")
        return self.view()

    async def _jobs_on(self, plan: DrillPlan, allow_jobs: bool) -> dict[str, str]:
        """job -> node of the running jobs on the plan's nodes; a job not marked drill-safe refuses the drill."""
        sched = getattr(self.engine.executors, "scheduler", None)
        if sched is None:
            return {}
        found, foreign = {}, []
        for node in plan.nodes:
            for job in await sched.jobs(node):
                comment = await sched.job_comment(job) if hasattr(sched, "job_comment") else None
                if comment and DRILL_SAFE in comment.split():
                    found[job] = node
                else:
                    foreign.append(f"{job} on {node}")
        if foreign and not allow_jobs:
            raise DrillRefused(f"nodes: job {', '.join(foreign)} is not marked drill-safe (Slurm comment "
                               f"{DRILL_SAFE!r}): the drill would drain it; pass --allow-jobs to drill anyway")
        return found

    def _versions(self) -> dict[str, str]:
        snap = self.store.snapshot()
        gpus = list(snap.select("supernode_gpu_info"))
        drivers = sorted({r.label("driver") for r in gpus} - {""})
        vbios = sorted({r.label("vbios") for r in gpus} - {""})
        return {"agent": __version__, "driver": ",".join(drivers) or "unknown (no NVML reading)",
                "vbios": ",".join(vbios) or "unknown", "firmware_drift": len(vbios) > 1}

    async def abort(self, who: str) -> dict[str, Any]:
        """Undo what the drill did: end the fault now. An agent restarted mid-drill has no runner: its open drill
        incidents are resolved by hand (the engine's undo runs as for `incidents resolve`), and the undo of
        every drill incident, open or already cleared (its synthetic reading went with the old process, so the
        zone read dry and the leak's undo waits for a person), is approved by the admin who aborted."""
        if self.active:
            self.facts["aborted_by"] = who
            self._abort.set()
            return self.view()
        eng = self.engine
        closed = [inc.id for inc in list(eng.incidents.open_incidents()) if inc.detail.get("drill")]
        for iid in closed:
            eng.close_by_person(iid, who)
        held = {iid for eff in eng.effects.values() for iid in eff["holders"]}  # what an undo has yet to give back
        undoing = [inc.id for inc in eng.incidents.recent() if inc.detail.get("drill") and inc.id in held
                   and inc.id not in closed]
        if closed or undoing:
            eng.journal.append("drill", result="aborted", detail={"drill": True, "by": who, "incidents": closed,
                                                                  "undoing": undoing, "no_runner": True})
            self._task = asyncio.get_running_loop().create_task(self._approve_undo(closed + undoing, who),
                                                                name="drill-undo")
        return {**self.view(), "resolved": closed, "undoing": undoing}

    async def _approve_undo(self, incidents: list[str], who: str, for_seconds: float = 300.0) -> None:
        """The undo approvals of drill incidents resolved without their runner (`resume_after_leak`): the admin
        who aborted ordered the undo; bounded, so a step that never asks leaves nothing behind."""
        until = time.time() + for_seconds
        while time.time() < until:
            for p in list(self.engine.pending.values()):
                if p.incident_id in incidents and p.phase == "undo" and not p.future.done():
                    await self.engine.approve_anywhere(p.id, who=who)
            await asyncio.sleep(POLL)

    # -- the drill's course ------------------------------------------------------------------------------------

    async def _supervise(self) -> None:
        plan = self.plan
        assert plan is not None
        deadline = self.started_at + plan.abort.after_seconds  # type: ignore[operator]
        try:
            while not self._abort.is_set() and time.time() < deadline and not self._course_done():
                await self._step()
                await self._sleep()
            aborted = self._abort.is_set() or time.time() >= deadline
            self.state = "ending"
            self.source.faulty = False  # type: ignore[union-attr]
            undo_by = time.time() + plan.target("undo_done")  # past it, the report says the undo did not happen
            while time.time() < undo_by and not self._undone():
                await self._approve_pending(phase="undo")
                await asyncio.sleep(POLL)  # not _sleep(): the abort is set by now, its wait would never yield
            await self.source.stop()  # type: ignore[union-attr]
            self.engine.drill_real = None
            self.state = "aborted" if aborted else ("passed" if self.build()["passed"] else "failed")
            self.report = self.build()
            self.engine.journal.append("drill", result=self.state, detail={"drill": True, "report": self.report})
        except Exception:
            log.exception("drill supervisor failed")
            self.state = "failed"
            if self.source is not None:
                await self.source.stop()

    async def _sleep(self) -> None:
        """Until the next poll, or the abort. Only for the course's loop: once the abort is set, waiting on it
        returns without yielding to the event loop, so a loop that went on calling this would spin the agent."""
        try:
            async with asyncio.timeout(POLL):
                await self._abort.wait()
        except TimeoutError:
            pass

    def incident(self) -> Any:
        for inc in self.engine.incidents.all():
            if inc.detail.get("drill") and inc.opened_at >= (self.started_at or 0) - 1:
                return inc
        return None

    async def _step(self) -> None:
        await self._approve_pending(phase="apply")
        await self._requeue()
        await self._check_jobs()

    async def _approve_pending(self, phase: str) -> None:
        inc = self.incident()
        if inc is None:
            return
        real = self.plan.real_actions()  # type: ignore[union-attr]
        for p in list(self.engine.pending.values()):
            if p.incident_id != inc.id or p.phase != phase or p.future.done():
                continue
            if phase == "apply" and p.action in real:
                continue  # a real destructive step waits for a person, as in a real fault
            await self.engine.approve_anywhere(p.id, who=f"drill:{self.plan.name}")  # type: ignore[union-attr]

    def _rows(self) -> list[Any]:
        """The journal's rows since the drill began (its own `injected` row first)."""
        return self.engine.journal.entries(since_seq=self.start_seq - 1)

    def _acted(self, action: str | None = None) -> set[str]:
        """The targets the drill's incident's playbook has done its mitigating action on (a drain: the nodes)."""
        inc = self.incident()
        if inc is None:
            return set()
        action = action or self.facts["acts_by"]
        return {e.target for e in self._rows() if e.incident_id == inc.id and e.kind == "result"
                and e.action == action and e.result == "done" and e.detail.get("phase", "apply") == "apply"}

    async def _requeue(self) -> None:
        if "requeue" not in self.plan.real:  # type: ignore[union-attr]
            return
        sched = self.engine.executors.scheduler
        drained = self._acted("drain")
        followed = self._job_events()
        for job, node in self.facts["jobs"].items():
            if job in self.facts["requeued"] or f"node={node}" not in drained:
                continue
            if self.plan.job is not None and (job not in followed or not followed[job].checkpoint):  # type: ignore
                continue  # the signal has not reached the job yet: requeue only after its checkpoint
            error = None
            try:
                await sched.requeue_job(job)
            except Exception as exc:
                error = str(exc)
            self.facts["requeued"][job] = time.time()
            self.engine.journal.append("drill", result="failed" if error else "done", action="requeue",
                                       target=f"job={job}", incident_id=self.incident().id,
                                       detail={"drill": True, "job": job, "from_node": node, "error": error})

    async def _check_jobs(self) -> None:
        """What Slurm says of each drill job after its requeue (state, node, restarts)."""
        sched = self.engine.executors.scheduler if self.facts["jobs"] else None
        if sched is None or not hasattr(sched, "job_fields"):
            return
        for job in self.facts["requeued"]:
            fields = await sched.job_fields(job, "JobState", "NodeList", "Restarts")
            if fields and fields.get("JobState") == "RUNNING" and int(fields.get("Restarts", "0") or 0) >= 1:
                self.facts.setdefault("slurm", {})[job] = {**fields, "seen_at": time.time()}

    def _job_events(self) -> dict[str, JobEvents]:
        """The events of the jobs the drill follows: the drill-safe jobs of its nodes that write to the plan's job
        log (the reference job). Another drill-safe job there (one that checkpoints and ends on the signal, as the
        demo's do) is drained with its node, not followed."""
        if self.plan is None or self.plan.job is None:
            return {}
        events = {job: job_events(self.plan.job.log, job, since=self.started_at or 0.0) for job in self.facts["jobs"]}
        return {job: ev for job, ev in events.items() if ev.starts or ev.unreadable}

    def _course_done(self) -> bool:
        """Everything the drill waits for before it ends the fault: the mitigation (a drain: with each job resumed
        elsewhere), or its stage's target passed without it (no incident, a step blocked by a guardrail): the
        fault then ends at once, and the report says which stage did not happen and why."""
        inc, plan, t0 = self.incident(), self.plan, self.started_at
        assert plan is not None and t0 is not None

        def late(stage: str) -> bool:
            return time.time() > t0 + plan.target(stage)
        if inc is None:
            return late("detected")
        if not self._acted():
            return late(ACTION_STAGE[self.facts["acts_by"]]) or inc.state in ("failed", "resolved")
        if inc.state in ("open", "mitigating"):
            return False  # the playbook has not finished (a dry-run step may still wait for its approval)
        if plan.job is None:
            return self._held()
        events = self._job_events()
        return bool(events) and all(job in self.facts.get("slurm", {}) and ev.resumed is not None
                                    for job, ev in events.items()) and self._held()

    def _held(self) -> bool:
        """The fault has lasted the plan's `hold_seconds` since the drill began."""
        return time.time() >= self.started_at + self.plan.hold_seconds  # type: ignore[operator,union-attr]

    def _undone(self) -> bool:
        """The fault is over: its incident resolved and every target of its mitigating action given back (a
        notice has nothing to give back)."""
        inc = self.incident()
        acts_by = self.facts["acts_by"]
        if inc is None:
            return not self._acted()
        if inc.state != "resolved":
            return False
        if acts_by in ("notify", "job_notify"):
            return True
        undo = [e for e in self._rows() if e.incident_id == inc.id and is_undo(e) and e.action == acts_by]
        return all(any(u.target == t for u in undo) for t in self._acted())

    # -- views ---------------------------------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        entries = [e for e in self._rows()]
        return build_report(self.plan, self.started_at, entries, self.facts, self._job_events(),  # type: ignore
                            self.state)

    def view(self) -> dict[str, Any]:
        if self.plan is None:
            return {"state": self.state}
        return {"state": self.state, "name": self.plan.name, "started_at": self.started_at,
                "report": self.report or self.build()}

    def banner(self) -> dict[str, Any] | None:
        """What every status page shows of the drill (agent/status/): that one runs, or the last one's end, and
        what it fakes, so nobody takes its leak for a real one; None before the first drill of this process."""
        if self.plan is None:
            return None
        return {"state": self.state, "active": self.active, "name": self.plan.name,
                "scenario": describe(self.plan.scenario), "nodes": list(self.plan.nodes),
                "started_at": self.started_at, "by": self.facts.get("by")}

    def page_report(self, max_age: float = 1.0) -> dict[str, Any] | None:
        """The report for the status page (with the admin token, as incidents): the final one once the drill
        ended, else built at most every `max_age` seconds (each build reads the drill's journal rows)."""
        if self.plan is None:
            return None
        if self.report is not None:
            return self.report
        at, rep = self._page_report
        if rep is None or time.monotonic() - at >= max_age:
            rep = self.build()
            self._page_report = (time.monotonic(), rep)
        return rep
