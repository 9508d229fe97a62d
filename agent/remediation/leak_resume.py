"""After a leak: nothing is undone until every detector of the leak's scope read dry for the hold, and a person
approved, shown each detector's dry history; a detector wet again (or unreadable) after the approval voids it.

Why apart: the leak's incident clears on its detector's short clear hold (seconds: the alert and the status
page follow the sensors), but a resume, a tray powered on or a valve opened on a cold plate that is still
weeping puts power and coolant back onto wet hardware. So the undo of every step of a leak-scoped playbook
(`leak_scope:` in its YAML) waits here: first the dry hold (leak_scope.dry_hold_seconds, on the engine's
clock, every detector of the scope that this agent reads and every detector that fired the leak), then the
step's undo approval (resume_after_leak; a tray's power-on is `always`) with the dry history on the pending
step, then the dry hold again at the moment of approval. A scope of which this agent reads no detector at all
(a leak from the webhook in a zone it does not watch) cannot be judged here: the undo then always waits for a
person (`always`, whatever `automatic` says), the pending step saying why. Part of RemediationEngine.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from .dry_hold import DryHistory
from .incidents import Incident
from .leak_scope import bmc_of_sensor
from .playbooks import Playbook, Step

DRY_RECHECK_SECONDS = 0.25  # how often a waiting undo looks at the dry history again (each look is cheap)
NOT_READ = "no detector of this scope is read by this agent: a person must confirm it is dry"
KEPT = "kept"


class LeakResumeGate:
    """Part of RemediationEngine: see the module docstring."""

    def leak_scope_verdict(self, inc: Incident, scope: str) -> tuple[bool, list[dict[str, Any]]]:
        """(every detector of the incident's scope dry for the hold, each detector's history)."""
        hist: DryHistory = self.detectors.dry
        return hist.verdict(self._scope_member(inc, scope), self._scope_required(inc, scope), self.clock(),
                            self.settings.leak_scope.dry_hold_seconds)

    def _scope_member(self, inc: Incident, scope: str) -> Callable[[str, str], bool]:
        t = inc.targets
        if scope == "tray" and t.get("tray"):
            trays = {t["tray"], *(n for n in inc.detail.get("watched") or () if isinstance(n, str))}
            inv = self.inventory
            bmcs = {e.name for e in getattr(inv, "redfish", []) if e.kind == "tray" and e.node in trays}
            bmcs |= {s.bmc for s in getattr(inv, "switch_trays", []) if s.name in trays}
            return lambda zone, sensor: bmc_of_sensor(sensor) in bmcs
        if scope == "zone" and t.get("zone"):
            return lambda zone, sensor: zone == t["zone"]
        return lambda zone, sensor: True  # the rack, the loop, or an incident whose targets are lost: every one

    @staticmethod
    def _scope_required(inc: Incident, scope: str) -> set[tuple[str, str]]:
        zone = inc.targets.get("zone")
        if scope not in ("tray", "zone") or not zone:
            return set()
        # `sensors`: the real detectors that fired (a drill's synthetic ones are recorded apart, detectors_cooling)
        return {(zone, s) for s in inc.detail.get("sensors") or () if isinstance(s, str)}

    async def leak_undo_gate(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str,
                             eff: dict[str, Any], approval: str | None,
                             before_approval: Callable[[str | None], Awaitable[str | None]]) -> str:
        """`go` once the scope is dry for the hold and (when the key is not automatic) a person approved while
        it still was; `kept` when another incident took the effect over meanwhile; `blocked` when the approval
        expired or the agent stopped (journaled by the caller). `before_approval` runs once the scope is dry
        (the resume health check), so the person approves with its result in the journal; it may turn an
        automatic undo into one a person approves."""
        scope = book.leak_scope or "rack"
        while True:
            if not await self._until_dry(inc, book, step, aid, tgt, eff, scope):
                return KEPT if self._held_by_others(inc, eff) else "blocked"
            key = await before_approval(approval)
            if not self.leak_scope_verdict(inc, scope)[1] and not self.guard.needs_approval(key):
                key = "always"  # nothing read here to judge the hold by: a person says it is dry, never a default
            if not self.guard.needs_approval(key):
                return "go"
            ok = await self._approve(inc, book, step, aid, tgt, "undo", key or "",
                                     evidence=lambda: self._dry_evidence(inc, scope))
            if not ok:
                return "blocked"
            dry, history = self.leak_scope_verdict(inc, scope)
            if dry or not history:
                return KEPT if self._held_by_others(inc, eff) else "go"
            self._block(inc, book, step, aid, tgt, "dry_hold", "approved, but a detector of the scope read wet or "
                        "could not be read within the dry hold since: waiting for the hold again", phase="undo")
            self.journal.append("dry_hold", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                                target=tgt, result="wet_again", detail={"scope": scope, "dry_history": history})

    def _dry_evidence(self, inc: Incident, scope: str) -> dict[str, Any]:
        """What the pending step shows a person, read at the moment they look (API, CLI, status page)."""
        dry, history = self.leak_scope_verdict(inc, scope)
        return {"leak_scope": scope, "dry_hold_seconds": self.settings.leak_scope.dry_hold_seconds,
                "dry_hold_passed": dry, "dry_history": history, **({} if history else {"dry_hold_note": NOT_READ})}

    @staticmethod
    def _held_by_others(inc: Incident, eff: dict[str, Any]) -> bool:
        return any(i != inc.id for i in eff["holders"])

    async def _until_dry(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, eff: dict[str, Any],
                         scope: str) -> bool:
        """Wait until the scope is dry for the hold (True), journaling the wait once and its end; False when
        another incident holds the effect now (the leak came back: its own undo waits in turn) or the agent
        stops."""
        announced = False
        while self.started:
            if self._held_by_others(inc, eff):
                return False
            dry, history = self.leak_scope_verdict(inc, scope)
            if not history:  # no detector of the scope is read by this agent (a webhook's leak, say): unjudged
                self.journal.append("dry_hold", action_id=aid, incident_id=inc.id, playbook=book.name,
                                    action=step.action, target=tgt, result="unjudged",
                                    detail={"scope": scope, "why": NOT_READ})
                return True
            if dry:
                self.journal.append("dry_hold", action_id=aid, incident_id=inc.id, playbook=book.name,
                                    action=step.action, target=tgt, result="dry",
                                    detail={"scope": scope, "dry_history": history})
                return True
            if not announced:
                announced = True
                self.journal.append("dry_hold", action_id=aid, incident_id=inc.id, playbook=book.name,
                                    action=step.action, target=tgt, result="waiting",
                                    detail={"scope": scope, "hold_seconds": self.settings.leak_scope.dry_hold_seconds,
                                            "dry_history": history})
            await asyncio.sleep(DRY_RECHECK_SECONDS)
        return False
