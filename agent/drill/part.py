"""One agent's part of a drill: the fault injected into its own store, its own incident's dry-run and undo
approvals, and what its own journal says of its node's stages.

Why a part: a zone leak endangers several nodes, each drained by its own agent. The agent that started the
drill (the conductor) and every other agent of the zone (agent/drill/follower.py) each run one part, on their
own node only; the conductor's report gathers every part's stages (agent/drill/report.py).

Why the part approves: a dry-run step's approval is still asked (journaled, shown as pending) so the drill
proves the approval path; the part answers it since nothing is written. The undo's approvals
(`resume_after_leak`) are answered by the part too once the drill ends: the person who started it with the
admin token ordered the undo with it.
"""

from __future__ import annotations

import time
from typing import Any

from .plan import DrillPlan
from .records import MAX_ROWS, printable
from .report import is_undo, node_stages
from .scenarios import Rack
from .source import DrillSource


class DrillPart:
    """The drill on this agent's node: `start`, then `step` on every poll, `end` the fault, `step(ending=True)`
    until `undone`, `stop`."""

    def __init__(self, hook: Any, store: Any, plan: DrillPlan, rack: Rack, drill_id: str, acts_by: str):
        self.hook, self.plan, self.drill_id, self.acts_by = hook, plan, drill_id, acts_by
        self.node = rack.node
        self.source = DrillSource(store, plan, rack)  # ValueError: a stand-in with nothing to stand for
        self.joined_at = time.time()
        self.start_seq = 0
        self.state = "running"  # running | ending | ended

    @property
    def engine(self) -> Any:
        return self.hook.engine  # the engine running now (a reload swaps it)

    def start(self, row: dict[str, Any]) -> None:
        """Journal the part's first row (kind `drill`: `row` its result and detail) and inject the fault."""
        self.engine.drill_real = self.plan.real_actions()
        result = row.pop("result")
        self.start_seq = self.engine.journal.append("drill", result=result, target=",".join(self.plan.nodes),
                                                    detail={"drill": True, "id": self.drill_id, **row},
                                                    ts=self.joined_at)
        self.source.start()

    def end(self) -> None:
        """The fault is over: the synthetic reading reads healthy (a dry sensor) from now on."""
        self.state = "ending"
        self.source.faulty = False

    async def stop(self) -> None:
        await self.source.stop()
        self.engine.drill_real = None
        self.state = "ended"

    # -- what the engine did ---------------------------------------------------------------------------------

    def incident(self) -> Any:
        for inc in self.engine.incidents.all():
            if inc.detail.get("drill") and inc.opened_at >= self.joined_at - 1:
                return inc
        return None

    def rows(self) -> list[Any]:
        """The journal's rows since the part began (its own first row first)."""
        return self.engine.journal.entries(since_seq=self.start_seq - 1)

    def acted(self, action: str | None = None) -> set[str]:
        """The targets the part's incident's playbook has done its mitigating action on (a drain: the nodes)."""
        inc = self.incident()
        if inc is None:
            return set()
        action = action or self.acts_by
        return {e.target for e in self.rows() if e.incident_id == inc.id and e.kind == "result"
                and e.action == action and e.result == "done" and e.detail.get("phase", "apply") == "apply"}

    async def step(self, ending: bool = False) -> None:
        """Approve the incident's pending dry-run steps (a real destructive step waits for a person, as in a
        real fault), and once the drill ends its undo's."""
        inc = self.incident()
        if inc is None:
            return
        phase = "undo" if ending else "apply"
        real = self.plan.real_actions()
        for p in list(self.engine.pending.values()):
            if p.incident_id != inc.id or p.phase != phase or p.future.done():
                continue
            if phase == "apply" and p.action in real:
                continue
            await self.engine.approve_anywhere(p.id, who=f"drill:{self.plan.name}")

    def undone(self) -> bool:
        """The fault is over here: its incident resolved and every target of its mitigating action given back (a
        notice has nothing to give back)."""
        inc = self.incident()
        if inc is None:
            return not self.acted()
        if inc.state != "resolved":
            return False
        if self.acts_by in ("notify", "job_notify"):
            return True
        undo = [e for e in self.rows() if e.incident_id == inc.id and is_undo(e) and e.action == self.acts_by]
        return all(any(u.target == t for u in undo) for t in self.acted())

    def progress(self, why: str = "") -> dict[str, Any]:
        """This node's part as the rack record carries it (agent/drill/records.py: check_progress)."""
        inc = self.incident()
        own = node_stages(self.rows(), self.acts_by)
        for line in own["stages"].values():
            if "why" in line:
                line["why"] = printable(line["why"])
        own["dry_run"] = [{**d, "target": printable(d["target"] or "")} for d in own["dry_run"][:MAX_ROWS]]
        own["touched"] = [printable(t) for t in own["touched"][:MAX_ROWS]]
        return {"drill": self.drill_id, "state": self.state, "why": printable(why),
                "incident_state": inc.state if inc is not None else None, **own}
