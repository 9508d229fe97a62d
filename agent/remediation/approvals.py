"""Steps waiting for a person: the pending table, approving one step (here or rack-wide), who approved.

Why apart: an approval is what lets a destructive step run; the rules of who may approve what (one step of one
episode, journaled with who before the step acts) live here and in the rack's state
(agent/coordination/rack_state.py), not among the step runner's guardrails. Part of RemediationEngine.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .incidents import Incident
from .playbooks import Playbook, Step
from .step_runner import COORDINATION_LOST

log = logging.getLogger("supernode.remediation")

@dataclass
class Pending:
    """A step waiting for a person's approval."""

    id: str
    incident_id: str
    playbook: str
    action: str
    target: str
    phase: str  # apply | undo
    approval: str
    created_at: float
    expires_at: float
    future: asyncio.Future
    # a shared step the rack leader waits on (agent.coordination.rack_state): its record in etcd
    rack_id: str | None = None
    rack_revision: int | None = None  # create revision of the pending record: what an approval must name
    rack_created_at: float = 0.0
    rack_doc: dict[str, Any] | None = None
    refused: set[tuple[str, int]] = field(default_factory=set)  # (key, revision) of approvals refused already
    # what a person is shown to decide on, read when they look: a leak's dry history (leak_resume.py)
    evidence: Callable[[], dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "incident_id": self.incident_id, "playbook": self.playbook, "action": self.action,
                "target": self.target, "phase": self.phase, "approval": self.approval,
                "created_at": self.created_at, "expires_at": self.expires_at,
                **(self.evidence() if self.evidence is not None else {})}

class AmbiguousApproval(Exception):
    """An incident id names several pending steps: a person approves one by its id, or all of them (`all`)."""

    def __init__(self, steps: list[dict[str, Any]]):
        super().__init__(f"{len(steps)} steps pending")
        self.steps = steps


class ApprovalDesk:
    """Part of RemediationEngine: see the module docstring."""

    async def _approve(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, phase: str,
                       key: str, evidence: Callable[[], dict[str, Any]] | None = None) -> bool:
        now = self.clock()  # shown to people as a time of day; the wait itself runs on the loop's monotonic clock
        fut = asyncio.get_running_loop().create_future()
        p = Pending(aid, inc.id, book.name, step.action, tgt, phase, key, now,
                    now + self.settings.guardrails.approval_expiry_seconds, fut, evidence=evidence)
        self.pending[aid] = p
        self.journal.append("approval", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result="pending", detail={"approval": key, "phase": phase})
        ok = False
        if key != COORDINATION_LOST:
            self.rack.pending_added(p, inc)  # etcd: rack state, so any agent can approve and a new leader carries on
        try:
            async with asyncio.timeout(self.settings.guardrails.approval_expiry_seconds):
                ok = await fut
        except asyncio.TimeoutError:
            ok = False
            self.journal.append("approval", action_id=aid, incident_id=inc.id, result="expired")
        finally:
            self.pending.pop(aid, None)
            self.rack.pending_removed(p, bool(ok))
        return bool(ok)

    async def approve_anywhere(self, ident: str, who: str = "api", all_: bool = False,
                               token: str | None = None) -> list[str]:
        """Approve here, and in the rack's state (etcd) for a step the leader waits on, wherever it runs.

        `ident`: a step's id (action id or rack id) approves that step; an incident id approves its one pending
        step, and only with `all_` several (else AmbiguousApproval lists them). An incident id names one
        episode: this agent's incident, or the leader's (rack steps of an earlier episode of the same fault are
        never approved by it). `who`: the person as the API saw them (the token's name, or the certificate
        subject under mTLS); `token`: the admin token's name, which keys the rack approval's proof."""
        person = token or who
        subject = who if who != person else None
        local = [p for p in self.pending.values() if ident in (p.id, p.rack_id) and not p.future.done()]
        exact, rack = self.rack.approval_candidates(ident, list(self.incidents.all()))
        if local or exact:
            rack = [] if local else rack
        else:
            local = [p for p in self.pending.values() if p.incident_id == ident and not p.future.done()]
            waiting_here = {p.rack_id for p in self.pending.values() if p.rack_id}
            rack = [r for r in rack if r["id"] not in waiting_here]
        if len(local) + len(rack) > 1 and not all_:
            raise AmbiguousApproval([p.as_dict() for p in local] + rack)
        done = [self._approve_local(p, person, subject, all_) for p in local]
        for rid in await self.rack.approve([r["id"] for r in rack], person, subject, all_):
            self.journal.append("approval", action_id=rid, result="approved",
                                detail={"approved_by": person, "approved_via": self.identity.node, "rack": True,
                                        "all": all_, **({"subject": subject} if subject else {})})
            done.append(rid)
        return done

    def approve(self, ident: str, who: str = "api", all_: bool = False) -> list[str]:
        """Approve a pending step of this agent by its id, or an incident's one pending step (all of them only
        with `all_`: else AmbiguousApproval); returns what was approved."""
        live = [p for p in self.pending.values() if not p.future.done()]
        steps = [p for p in live if ident in (p.id, p.rack_id)] or [p for p in live if p.incident_id == ident]
        if len(steps) > 1 and not all_:
            raise AmbiguousApproval([p.as_dict() for p in steps])
        return [self._approve_local(p, who, None, all_) for p in steps]

    def _approve_local(self, p: Pending, who: str, subject: str | None, all_: bool) -> str:
        """Journal who approved (before the step acts on it), then let the step go on."""
        self.journal.append("approval", action_id=p.id, incident_id=p.incident_id, playbook=p.playbook,
                            action=p.action, target=p.target, result="approved",
                            detail={"approved_by": who, "approved_via": self.identity.node, "phase": p.phase,
                                    "all": all_, **({"subject": subject} if subject else {}),
                                    **({"rack_id": p.rack_id} if p.rack_id else {})})
        p.future.get_loop().call_soon_threadsafe(p.future.set_result, True)
        return p.id

    def pending_view(self) -> list[dict[str, Any]]:
        """This agent's pending steps, then the rack's (etcd) that the leader waits on elsewhere."""
        local = [dict(p.as_dict(), **({"rack_id": p.rack_id} if p.rack_id else {})) for p in self.pending.values()]
        mine = {p.get("rack_id") for p in local}
        return local + [r for r in self.rack.pending_view() if r["id"] not in mine]
