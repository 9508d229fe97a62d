"""Runs a drill inside the agent: the one it was started on (the conductor) checks the plan against the rack and
its jobs, announces a zone's drill to the rack, runs its own node's part, does the drill's requeue of its jobs,
then ends the fault everywhere, waits for every part's undo and writes the report.

Why a conductor and parts: a zone leak endangers several nodes, each drained by its own agent (as a real leak
is: every agent reads the leak controller's poll and drains its own node). The conductor's node takes part only
when the zone holds it; every other agent of the zone joins through the rack (agent/drill/rack.py,
agent/drill/follower.py) and publishes its part, which the conductor's report gathers. Every row the drill
writes is a journal row of kind `drill`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agent import __version__
from agent.auth import token_map

from .follower import FollowerCourse
from .job_check import JobEvents, drill_safe_jobs, job_events
from .part import DrillPart
from .plan import ACTION_STAGE, DrillPlan, DrillRefused, PlanError, check_against_inventory
from .rack import RackChannel
from .records import Announced, announcement
from .report import build_report
from .scenarios import describe, mitigation, participants, rack_of

log = logging.getLogger("supernode.drill")
POLL = 0.2
__all__ = ["DrillRefused", "DrillRunner"]


class DrillRunner(FollowerCourse):
    """At most one drill at a time per agent, conducted here or joined. `hook` is the remediation hook (its
    engine may be swapped); `coordination` the agent's rack coordinator (None: this agent alone)."""

    def __init__(self, store: Any, hook: Any, coordination: Any = None):
        self.store, self.hook = store, hook
        self.plan: DrillPlan | None = None
        self.role = "conductor"  # conductor | follower (of `self.conductor`'s drill)
        self.conductor: str | None = None
        self.drill_id = ""
        self.state = "idle"  # idle | running | ending | passed | failed | aborted | ended (a follower's)
        self.started_at: float | None = None
        self.start_seq = 0
        self.facts: dict[str, Any] = {}
        self.part: DrillPart | None = None
        self._task: asyncio.Task | None = None
        self._abort = asyncio.Event()
        self.report: dict[str, Any] | None = None
        self._page_report: tuple[float, dict[str, Any] | None] = (0.0, None)
        self.channel: RackChannel | None = None
        self._sign: Any = None  # (state, aborted_by) -> our signed announcement of the drill we conduct
        self._starting = asyncio.Lock()
        if coordination is not None and hasattr(coordination, "publish_drill"):
            cfg = hook.loaded.config
            self.channel = RackChannel(coordination, cfg.agent.node, list(cfg.inventory.nodes) or [cfg.agent.node],
                                       hook.admin_tokens, self._rack, self.on_announce)
            coordination.drill_channel = self.channel
        FollowerCourse.__init__(self)

    @property
    def engine(self) -> Any:
        return self.hook.engine

    @property
    def active(self) -> bool:
        return self.state in ("running", "ending")

    def _rack(self) -> Any:
        eng = self.engine
        return rack_of(eng.inventory, eng.identity.node, eng.settings.leak_scope.watch_below_trays)

    def _acts_by(self, plan: DrillPlan) -> str:
        judge = self.engine.detectors.gpu_faults
        return mitigation(plan.scenario, lambda code: judge.rules.class_of(judge.entries.get(code),
                                                                           judge.actions_of(code)[0])[0])

    async def start(self, plan: DrillPlan, who: str, allow_jobs: bool = False, token: str | None = None
                    ) -> dict[str, Any]:
        """Conduct `plan` from this agent (`who` the caller, `token` the name of the admin token it used: a zone
        drill's announcement is signed with it). One start at a time: its checks await Slurm and the rack."""
        async with self._starting:
            return await self._start(plan, who, allow_jobs, token)

    async def _start(self, plan: DrillPlan, who: str, allow_jobs: bool, token: str | None) -> dict[str, Any]:
        if self.active or self._joining:
            raise DrillRefused(f"drill {self.plan.name} is running: wait for it or `drill --abort`")  # type: ignore
        eng = self.engine
        started = time.time()
        drill_id = f"{plan.name}@{eng.identity.node}:{int(started * 1000)}"
        try:
            rack = self._rack()
            check_against_inventory(plan, rack)
            acts_by = self._acts_by(plan)
            if plan.job is not None and acts_by != "drain":
                raise PlanError(f"job: a {describe(plan.scenario)} drains no node, so no job is moved: leave job out")
            nodes = participants(plan.scenario, rack)
            secret = self._signing_key(nodes, rack.node, token)
            part = DrillPart(self.hook, self.store, plan, rack, drill_id, acts_by) if rack.node in nodes else None
            if secret is not None:
                await self._reach(nodes, rack.node)
        except (PlanError, ValueError) as exc:
            raise DrillRefused(str(exc)) from None
        jobs = await self._jobs_on(plan.nodes, allow_jobs)
        self.plan, self.part, self.state, self.report, self.role, self.conductor = plan, part, "running", None, \
            "conductor", rack.node
        self.drill_id, self._page_report, self._abort, self.started_at = drill_id, (0.0, None), asyncio.Event(), started
        self.facts = {"jobs": jobs, "requeued": {}, "by": who, "versions": self._versions(), "acts_by": acts_by,
                      "participants": nodes, "node": rack.node, "id": drill_id}
        row = {"plan": plan.model_dump(mode="json"), "by": who, "jobs": jobs, "allow_jobs": allow_jobs,
               "participants": nodes}
        if part is not None:
            part.joined_at = started
            part.start({"result": "injected", **row})
            self.start_seq = part.start_seq
        else:  # the zone does not hold this agent's node: it announces and reports, its peers drain
            self.start_seq = eng.journal.append("drill", result="announced", target=",".join(plan.nodes),
                                                detail={"drill": True, "id": drill_id, **row}, ts=started)
        self._sign = None if secret is None else (
            lambda state, aborted_by=None: announcement(plan, drill_id, token, rack.node, started,  # type: ignore
                                                        allow_jobs, secret, state, aborted_by))
        if self._sign is not None:
            self._announce("running")
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name="drill")
        return self.view()

    def _signing_key(self, nodes: list[str], me: str, token: str | None) -> Any:
        """The admin token's secret that signs a drill other agents take part in (None: only this agent's node
        takes part); PlanError when the caller's token is not one of this agent's."""
        if nodes == [me]:
            return None
        secret = token_map(self.hook.admin_tokens).get(token or "")
        if secret is None:
            raise PlanError("a zone drill is announced to the rack signed with the caller's admin token: none here")
        return secret

    async def _reach(self, nodes: list[str], me: str, within: float = 6.0) -> None:
        """Every other participant's agent hears this one (a peer's feed reopens within 5 s of its start);
        PlanError naming those that do not: they would not drain their node."""
        deadline = time.monotonic() + within
        while True:
            reach = self.channel.reachable() if self.channel is not None else set()
            unreachable = [n for n in nodes if n != me and n not in reach]
            if not unreachable:
                return
            if time.monotonic() >= deadline:
                raise PlanError(f"nodes: {', '.join(unreachable)}'s agent cannot be reached through rack coordination "
                                "(static: inventory.agent_urls, its drill feed not open; etcd: not a live member): it "
                                "would not drain its node")
            await asyncio.sleep(POLL)

    def _announce(self, state: str | None, aborted_by: str | None = None) -> None:
        """Our announcement to the rack (None: withdrawn) with our own part's progress."""
        if self.channel is None:
            return
        if state is None:
            self.channel.announce = None
        elif self._sign is not None:
            self.channel.announce = self._sign(state, aborted_by)
        self._publish()

    def _publish(self) -> None:
        if self.channel is not None and self.part is not None:
            self.channel.progress = self.part.progress()
        if self.channel is not None:
            self.channel.publish()

    async def _jobs_on(self, nodes: list[str], allow_jobs: bool) -> dict[str, str]:
        return await drill_safe_jobs(getattr(self.engine.executors, "scheduler", None), nodes, allow_jobs)

    def _versions(self) -> dict[str, str]:
        snap = self.store.snapshot()
        gpus = list(snap.select("supernode_gpu_info"))
        drivers = sorted({r.label("driver") for r in gpus} - {""})
        vbios = sorted({r.label("vbios") for r in gpus} - {""})
        return {"agent": __version__, "driver": ",".join(drivers) or "unknown (no NVML reading)",
                "vbios": ",".join(vbios) or "unknown", "firmware_drift": len(vbios) > 1}

    async def abort(self, who: str) -> dict[str, Any]:
        """Undo what the drill did: end the fault now (a conductor: on every agent of the drill; a follower: on its
        own node). An agent restarted mid-drill has no runner: its open drill incidents are resolved by hand (the
        engine's undo runs as for `incidents resolve`), and the undo of every drill incident, open or already
        cleared (its synthetic reading went with the old process, so the zone read dry and the leak's undo waits
        for a person), is approved by the admin who aborted."""
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

    # -- the conductor's course ----------------------------------------------------------------------------

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
            if self.part is not None:
                self.part.end()
            self._announce("ending", self.facts.get("aborted_by"))
            undo_by = time.time() + plan.target("undo_done")  # past it, the report says the undo did not happen
            while time.time() < undo_by and not self._undone():
                if self.part is not None:
                    await self.part.step(ending=True)
                self._publish()
                await asyncio.sleep(POLL)  # not _sleep(): the abort is set by now, its wait would never yield
            if self.part is not None:
                await self.part.stop()
            self.state = "aborted" if aborted else ("passed" if self.build()["passed"] else "failed")
            self.report = self.build()
            self.engine.journal.append("drill", result=self.state, detail={"drill": True, "id": self.drill_id,
                                                                           "report": self.report})
        except Exception:
            log.exception("drill supervisor failed")
            self.state = "failed"
            if self.part is not None:
                await self.part.stop()
        self._announce(None)

    async def _sleep(self) -> None:
        """Until the next poll, or the abort. Only for the course's loop: once the abort is set, waiting on it
        returns without yielding to the event loop, so a loop that went on calling this would spin the agent."""
        try:
            async with asyncio.timeout(POLL):
                await self._abort.wait()
        except TimeoutError:
            pass

    async def _step(self) -> None:
        if self.part is not None:
            await self.part.step()
        self._publish()
        await self._requeue()
        await self._check_jobs()

    def parts(self) -> dict[str, dict[str, Any] | None]:
        """Each participant's part now: ours from our journal, the peers' as they published it."""
        peers = self.channel.parts(self.drill_id) if self.channel is not None else {}
        own = {self.conductor: self.part.progress()} if self.part is not None else {}
        return {n: own.get(n) or peers.get(n) for n in self.facts.get("participants", [])}

    @staticmethod
    def _reached(part: dict[str, Any] | None, stage: str) -> bool:
        return part is not None and "at" in part.get("stages", {}).get(stage, {})

    def _drained_nodes(self) -> set[str]:
        return {n for n, p in self.parts().items() if self._reached(p, "drained")}

    async def _requeue(self) -> None:
        if "requeue" not in self.plan.real:  # type: ignore[union-attr]
            return
        sched = self.engine.executors.scheduler
        drained = self._drained_nodes()
        followed = self._job_events()
        for job, node in self.facts["jobs"].items():
            if job in self.facts["requeued"] or node not in drained:
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
                                       target=f"job={job}", incident_id=(self.parts().get(node) or {}).get("incident"),
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
        if self.plan is None or self.plan.job is None or self.role != "conductor":
            return {}
        events = {job: job_events(self.plan.job.log, job, since=self.started_at or 0.0) for job in self.facts["jobs"]}
        return {job: ev for job, ev in events.items() if ev.starts or ev.unreadable}

    def _course_done(self) -> bool:
        """Everything the drill waits for before it ends the fault: the mitigation on every participating node (a
        drain: with each job resumed elsewhere), or its stage's target passed without it (no incident, a step
        blocked by a guardrail, an agent that never joined): the fault then ends at once, and the report says
        which stage did not happen where, and why."""
        plan, t0, parts = self.plan, self.started_at, self.parts()
        assert plan is not None and t0 is not None
        stage = ACTION_STAGE[self.facts["acts_by"]]

        def late(s: str) -> bool:
            return time.time() > t0 + plan.target(s)
        if any(p is not None and p.get("state") == "refused" for p in parts.values()):
            return True
        if not all(self._reached(p, "detected") for p in parts.values()):
            return late("detected")
        if not all(self._reached(p, stage) for p in parts.values()):
            return late(stage) or any(p.get("incident_state") in ("failed", "resolved") for p in parts.values()
                                      if p is not None and not self._reached(p, stage))
        if any(p.get("incident_state") in ("open", "mitigating") for p in parts.values() if p is not None):
            return False  # a playbook has not finished (a dry-run step may still wait for its approval)
        if plan.job is None:
            return self._held()
        events = self._job_events()
        return bool(events) and all(job in self.facts.get("slurm", {}) and ev.resumed is not None
                                    for job, ev in events.items()) and self._held()

    def _held(self) -> bool:
        """The fault has lasted the plan's `hold_seconds` since the drill began."""
        return time.time() >= self.started_at + self.plan.hold_seconds  # type: ignore[operator,union-attr]

    def _undone(self) -> bool:
        """Every part is over: ours undone, each peer's undo done, its part ended or refused (a peer never heard
        from has nothing to give back that the drill knows of: its report line says so)."""
        if self.part is not None and not self.part.undone():
            return False
        peers = {n: p for n, p in self.parts().items() if n != self.conductor}
        return all(p is None or p.get("state") in ("ended", "refused") or self._reached(p, "undo_done")
                   for p in peers.values())

    # -- views ---------------------------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        return build_report(self.plan, self.started_at, self.engine.journal.entries(since_seq=self.start_seq - 1),  # type: ignore
                            self.facts, self._job_events(), self.state, self.parts())

    def view(self) -> dict[str, Any]:
        if self.plan is None:
            return {"state": self.state}
        if self.role == "follower":
            return {"state": self.state, "name": self.plan.name, "started_at": self.started_at, "id": self.drill_id,
                    "conductor": self.conductor, "part": self.part.progress() if self.part is not None else None}
        return {"state": self.state, "name": self.plan.name, "started_at": self.started_at, "id": self.drill_id,
                "report": self.report or self.build()}

    def banner(self) -> dict[str, Any] | None:
        """What every status page shows of the drill (agent/status/): that one runs, or the last one's end, and
        what it fakes, so nobody takes its leak for a real one; None before the first drill of this process."""
        if self.plan is None:
            return None
        return {"state": self.state, "active": self.active, "name": self.plan.name,
                "scenario": describe(self.plan.scenario), "nodes": list(self.plan.nodes),
                "started_at": self.started_at, "by": self.facts.get("by"), "conductor": self.conductor}

    def page_report(self, max_age: float = 1.0) -> dict[str, Any] | None:
        """The report for the status page (with the admin token, as incidents): the final one once the drill
        ended, else built at most every `max_age` seconds (each build reads the drill's journal rows). A follower
        has none: the report is its conductor's."""
        if self.plan is None or self.role != "conductor":
            return None
        if self.report is not None:
            return self.report
        at, rep = self._page_report
        if rep is None or time.monotonic() - at >= max_age:
            rep = self.build()
            self._page_report = (time.monotonic(), rep)
        return rep

    def on_announce(self, peer: str, ann: Announced | None) -> None:
        """A peer's drill announcement (checked), or its end (None): join, end or ignore (follower.py)."""
        self.heard(peer, ann)
