"""The derate by margin follows the loop: an applied derate is planned again when the loop's capacity moves.

Why apart: incidents run their playbook once; a coolant incident's cap by
thermal margin (actions/margin_cap.py) was sized for the loop at the moment
it opened. As a second pump fails, the flow recovers in part or the supply
warms, the share of power to shed changes; this watch, on every snapshot the
coolant detectors read, computes that share for each open coolant incident
whose cap it applied, and runs the cap step again (its own action id,
"replan-N", through the same guardrails and journal) once it differs from
the applied share by `remediation.derate.replan_shed_change`, at most every
`replan_min_interval_seconds` (hysteresis: one poll's noise plans nothing).
The re-plan keeps the first apply's effect, so the undo on recovery
restores the limits found before the first cap. Part of RemediationEngine
(agent/remediation/engine.py).
"""

from __future__ import annotations

import asyncio
import logging

from agent.snapshot import Snapshot

from .derate import loop_inputs
from .detectors_cooling import loop_evidence

log = logging.getLogger("supernode.remediation")

DERATE_DETECTORS = ("coolant_flow_low", "coolant_supply_hot")


class DerateWatch:
    """Part of RemediationEngine: see the module docstring."""

    def watch_derates(self, snap: Snapshot) -> None:
        planner = getattr(self.actions.get("gpu_power_cap"), "margins", None)
        if planner is None:
            return
        s = self.settings.derate
        # incident -> (when its derate was last planned, how many re-plans): kept on the engine, per instance
        replans: dict[str, tuple[float, int]] = self.__dict__.setdefault("_replans", {})
        open_now = self.incidents.open_incidents()
        for gone in set(replans) - {i.id for i in open_now}:
            del replans[gone]
        for inc in open_now:
            book = self._playbook_for(inc) if inc.detector in DERATE_DETECTORS else None
            steps = [(i, st) for i, st in enumerate(book.steps) if st.action == "gpu_power_cap"
                     and st.params.get("mode") == "thermal_margin"] if book is not None else []
            plan = planner.plan_of(inc.id) if steps else None
            if plan is None or plan.get("method") != "thermal_margin":
                continue  # not applied yet, or the flat fallback: nothing to follow
            evidence = loop_evidence(snap, inc.targets.get("cdu", ""))
            loop = loop_inputs(evidence)
            idx, step = steps[0]
            shed = planner.shed_now(self.identity.node, loop, step.params) if not isinstance(loop, str) else None
            at, n = replans.get(inc.id, (snap.monotonic, 0))
            replans.setdefault(inc.id, (at, n))
            if shed is None or abs(shed - plan["shed_fraction"]) < s.replan_shed_change \
                    or snap.monotonic - at < s.replan_min_interval_seconds:
                continue
            replans[inc.id] = (snap.monotonic, n + 1)
            log.info("derate re-planned", extra={"incident": inc.id, "shed_before": plan["shed_fraction"],
                                                 "shed_now": round(shed, 4)})
            # A re-plan may raise our own limits again, but never past another kind of incident's cap on the same
            # GPU (the PDU budget's, a hot GPU's): the lower limit keeps winning
            others = {h for (kind, _), eff in self.effects.items() if kind == "gpu_power_cap"
                      and inc.id in eff["holders"] for h in eff["holders"] if h != inc.id}
            foreign = sorted(h for h in others if getattr(self.incidents.get(h), "detector", None)
                             not in DERATE_DETECTORS)
            inc.detail = {**inc.detail, **evidence, "derate_raise_ok": not foreign}
            planner.replan(inc.id)
            running = self.__dict__.setdefault("_replanning", {})
            task = self._spawn(self._replan(inc, book, idx, step, f"replan-{n + 1}"))
            running.setdefault(inc.id, set()).add(task)
            task.add_done_callback(lambda t, iid=inc.id: running.get(iid, set()).discard(t))

    async def _replan(self, inc, book, idx: int, step, attempt: str) -> None:
        if inc.state == "resolved":
            return  # recovered meanwhile: the undo gives the limits back, a re-plan would cap them again
        targets = await self.resolve_targets(step.targets, inc)
        await asyncio.gather(*(self.run_step(inc, book, idx, step, t, attempt) for t in targets))

    async def replans_settled(self, incident_id: str) -> None:
        """Wait for the re-plans of `incident_id` still in flight. Why the undo waits: a re-plan whose write lands
        after the undo's would leave a GPU capped by an incident already resolved (its effect given back before
        the re-plan's result recorded a new one, which nothing would undo)."""
        running = self.__dict__.get("_replanning", {}).pop(incident_id, set())
        if running:
            await asyncio.gather(*running, return_exceptions=True)
