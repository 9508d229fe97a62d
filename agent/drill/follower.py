"""An agent's part in a drill another agent conducts: joined on the conductor's checked announcement
(agent/drill/rack.py), ended when the conductor says so, when its announcement goes, at the plan's abort
deadline, or by `drill --abort` here.

Why each agent of the zone injects the fault itself: the drill then enters every endangered agent where a real
leak's reading does (its own snapshot store), so its own detector, guardrails and playbook drain its own node,
as for a real leak whose poll reaches it through the rack. What it may touch is still the plan's: it joins only
when the plan names its node and the zone holds it, marks its incident drill (destructive steps dry-run unless
the plan lists them), and refuses, as the conductor does, when its node runs a job not marked drill-safe and
the drill was not started with --allow-jobs. Its part is published for the conductor's report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .part import DrillPart
from .plan import DrillRefused, PlanError
from .records import Announced, printable
from .scenarios import participants, rack_wide

log = logging.getLogger("supernode.drill")
POLL = 0.2
REMEMBERED = 64  # drill ids this agent has ended (a replayed announcement of one is not joined again)


class FollowerCourse:
    """Mixed into DrillRunner: what it does with the rack's drill announcements."""

    def __init__(self) -> None:
        self.done_ids: list[str] = []
        self._joining = False

    def heard(self, peer: str, ann: Announced | None) -> None:
        if ann is None or ann.state != "running":
            if self.role == "follower" and self.conductor == peer and self.active:  # type: ignore[attr-defined]
                if ann is not None and ann.id == self.drill_id and ann.aborted_by:  # type: ignore[attr-defined]
                    self.facts.setdefault("aborted_by", ann.aborted_by)  # type: ignore[attr-defined]
                self._abort.set()  # type: ignore[attr-defined]  # the conductor ended it, or is gone: end ours
            return
        if ann.id in self.done_ids or self._joining or (self.drill_id == ann.id and self.active):  # type: ignore
            return
        rack = self._rack()  # type: ignore[attr-defined]
        if not rack_wide(ann.plan.scenario) or rack.node not in ann.plan.nodes \
                or rack.node not in participants(ann.plan.scenario, rack):
            return  # the plan leaves this node out: not ours to touch
        if self.active or self._starting.locked():  # type: ignore[attr-defined]
            self._refuse(ann, "another drill is running (or starting) on this agent")
            return
        self._joining = True
        asyncio.get_running_loop().create_task(self._join(peer, ann, rack), name="drill-join")

    def _refuse(self, ann: Announced, why: str) -> None:
        """Say so to the conductor (its report names this node and why) and in the journal; never join it."""
        self._remember(ann.id)
        log.warning("drill refused", extra={"drill": ann.id, "conductor": ann.via, "why": why[:300]})
        self.engine.journal.append("drill", result="refused", detail={  # type: ignore[attr-defined]
            "drill": True, "id": ann.id, "conductor": ann.via, "by": ann.by, "why": why})
        if self.channel is not None:  # type: ignore[attr-defined]
            self.channel.progress = {"drill": ann.id, "state": "refused", "why": printable(why), "stages": {}}  # type: ignore
            self.channel.publish()  # type: ignore[attr-defined]

    def _remember(self, drill_id: str) -> None:
        self.done_ids = [*self.done_ids[-(REMEMBERED - 1):], drill_id]

    async def _join(self, peer: str, ann: Announced, rack: Any) -> None:
        try:
            try:
                acts_by = self._acts_by(ann.plan)  # type: ignore[attr-defined]
                jobs = await self._jobs_on([rack.node], ann.allow_jobs)  # type: ignore[attr-defined]
                part = DrillPart(self.hook, self.store, ann.plan, rack, ann.id, acts_by)  # type: ignore
            except (DrillRefused, PlanError, ValueError) as exc:
                self._refuse(ann, str(exc))
                return
            heard = self.channel.announced.get(peer) if self.channel is not None else None  # type: ignore
            if heard is None or heard.id != ann.id or heard.state != "running":
                return  # it ended while this agent read its jobs
            self.plan, self.part, self.role, self.conductor, self.drill_id = ann.plan, part, "follower", peer, ann.id
            self.state, self.report, self.started_at, self._abort = "running", None, ann.started_at, asyncio.Event()
            self.facts = {"by": ann.by, "acts_by": acts_by, "node": rack.node, "id": ann.id, "jobs": jobs,
                          "participants": [rack.node]}
            part.start({"result": "joined", "plan": ann.plan.model_dump(mode="json"), "by": ann.by,
                        "conductor": peer, "jobs": jobs, "allow_jobs": ann.allow_jobs})
            self.start_seq = part.start_seq
            self._publish()  # type: ignore[attr-defined]
            self._task = asyncio.get_running_loop().create_task(self._follow(ann, part), name="drill-follow")
        finally:
            self._joining = False

    async def _follow(self, ann: Announced, part: DrillPart) -> None:
        """The part's course: the fault until the conductor ends it (or the deadline, or an abort here), then its
        undo, bounded by the plan's undo target."""
        try:
            while not self._abort.is_set() and time.time() < ann.deadline():  # type: ignore[attr-defined]
                await part.step()
                self._publish()  # type: ignore[attr-defined]
                await self._sleep()  # type: ignore[attr-defined]
            self.state = "ending"
            part.end()
            undo_by = time.time() + ann.plan.target("undo_done")
            while time.time() < undo_by and not part.undone():
                await part.step(ending=True)
                self._publish()  # type: ignore[attr-defined]
                await asyncio.sleep(POLL)
            await part.stop()
            self.state = "aborted" if self.facts.get("aborted_by") else "ended"
        except Exception:
            log.exception("drill part failed")
            self.state = "failed"
            await part.stop()
        self._remember(ann.id)
        self.engine.journal.append("drill", result=self.state, detail={  # type: ignore[attr-defined]
            "drill": True, "id": ann.id, "conductor": ann.via, "part": part.progress()})
        self._publish()  # type: ignore[attr-defined]
