"""An incident's life: opened by a detector or a webhook alert, its playbook started, closed and undone.

Why apart: detection runs on every snapshot (handed to the loop from any source's thread) and decides only
whether an incident opens or clears; what its playbook then does is the step runner's. Part of
RemediationEngine (agent/remediation/engine.py), which holds the state.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from agent.loop_calls import call_soon_from_anywhere
from agent.reliability import classify
from agent.snapshot import Snapshot

from .actions import target_str
from .detectors import Detectors
from .incidents import Incident
from .playbooks import find_playbook
from .steps import action_id

log = logging.getLogger("supernode.remediation")

LEAK_SOURCES = ("leak", "redfish")  # source kinds whose first wet reading is re-read at once
COOLANT_FAMILIES = Detectors.INPUTS["_coolant"]  # what a derate's loop reads


class IncidentLifecycle:
    """Part of RemediationEngine: see the module docstring."""

    def on_snapshot(self, snap: Snapshot, origin: str) -> None:
        """Store listener (any thread): hand the snapshot to the loop; never blocks."""
        loop = self.loop
        if loop is None or not self.started or loop.is_closed():
            return
        # a source's poll publishes on the loop: then no wake-up through the loop's self-pipe
        call_soon_from_anywhere(loop, self._evaluate, snap, origin)

    def _evaluate(self, snap: Snapshot, origin: str = "") -> None:
        # Only the detectors this source feeds: a leak poll twice a second does not re-run the NVLink rates.
        families = snap.families_of(origin) if origin else None
        for ev in self.detectors.evaluate(snap, families):
            if ev.kind == "fire":
                self.fire(ev.detector, ev.targets, ev.severity, "local", ev.detail)
            else:
                self.clear(ev.detector, ev.targets)
        if families is None or families & COOLANT_FAMILIES:
            self.watch_derates(snap)  # an applied derate by margin follows the loop (derate_watch.py)
        # A first wet reading is confirmed by an immediate re-read of the same source rather than
        # a whole poll interval later: two consecutive polls, within one interval plus a few ms.
        # Any source of leak inputs (a Modbus leak controller, a Redfish tray BMC) is confirmed the same way.
        if self.repoll is not None and origin.split("/", 1)[0] in LEAK_SOURCES \
                and self.detectors.leak_awaiting_confirmation():
            self.repoll(origin)

    def fire(self, detector: str, targets: Mapping[str, str], severity: str, source: str = "local",
             detail: Mapping[str, Any] | None = None) -> Incident | None:
        if detector == "pdu_outlet_off" and ("pdu_outlet", target_str(targets)) in self.effects:
            return None  # the agent switched it off itself (a pdu_outlet step): not a failure
        failure = None
        if self.incidents.find(detector, targets) is None:
            failure = classify(detector, targets, detail or {}, self.identity.node,
                               {z.name: z.nodes for z in self.inventory.leak_zones})
            if failure is not None:
                detail = {**(detail or {}), "component": failure.as_dict()}
        inc, new = self.incidents.fire(detector, targets, severity, source, detail)
        if new and failure is not None:
            self.component_failures[failure.cls] = self.component_failures.get(failure.cls, 0) + 1
        if new:
            book = find_playbook(self.playbooks, detector, dict(targets))
            if book is not None:
                inc.playbook = book.name
                self._spawn(self.run_playbook(inc, book))
            if detector == "leak_tray":  # the trays below it read at the leak interval (leak_watch.py)
                self._spawn(self.watch_below(inc))
        return inc

    def clear(self, detector: str, targets: Mapping[str, str]) -> Incident | None:
        inc = self.incidents.find(detector, targets)
        if inc is None:
            return None
        self._close(inc, undo=True)
        return inc

    def _close(self, inc: Incident, undo: bool) -> None:
        was_open = inc.state != "resolved"
        self.incidents.transition(inc, "resolved")
        component = inc.detail.get("component")
        if was_open and inc.state == "resolved" and isinstance(component, dict) and component.get("class"):
            self._count_repair(str(component["class"]), inc.duration())
        self.rack.incident_closed(inc)
        for p in list(self.pending.values()):
            if p.incident_id == inc.id and (p.phase == "apply" or not undo) and not p.future.done():
                p.future.set_result(False)
        book = self._playbook_for(inc)
        if undo and book is not None and book.undo_on_resolve:
            self._spawn(self.run_undo(inc, book))

    def close_by_person(self, ident: str, who: str, reject: bool = False) -> Incident | None:
        """A person closes an open incident: `resolve` undoes its actions as the playbook says (approvals
        still apply); `reject` (a false alarm, or the person takes over) stops it and undoes nothing: its
        effects are released, never undone later. Journaled with who."""
        inc = self.incidents.get(ident)
        if inc is None or inc.state == "resolved":
            return None
        inc.detail = {**inc.detail, "closed_by": who, "resolution": "rejected" if reject else "resolved_by_person"}
        if reject:
            for (kind, tgt), eff in list(self.effects.items()):
                apply_id = eff["holders"].pop(inc.id, None)
                eff.get("playbooks", {}).pop(inc.id, None)
                if apply_id is None:
                    continue
                self.journal.append("result", action_id=action_id(inc.id, -1, tgt, "release"), incident_id=inc.id,
                                    playbook=inc.playbook, action=kind, target=tgt, result="released",
                                    detail={"phase": "undo", "apply_action_id": apply_id, "by": who,
                                            "why": "incident rejected: left as it is, for a person"})
                if not eff["holders"]:
                    del self.effects[(kind, tgt)]
        self._close(inc, undo=not reject)
        return inc
