"""What the agent owns after a crash: reconcile verdicts, effects rebuilt from the journal, ownership carried over.

Why its own module: ownership is what makes undo safe and complete. A cap or a drain the agent
made must be undone even if the agent died between acting and journaling, or could not read the
device when it came back; one it did not make must never be. The journal (each intent's plan
records what was found before and whether it was ours) and Slurm's reason marker are the two
records; nothing here trusts memory.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def verdict_result(verdict: str, phase: str) -> str:
    """The result row for a reconciled intent: done/undone, failed, or unknown (re-checked until known)."""
    if verdict == "applied":
        return "undone" if phase == "undo" else "done"
    if verdict == "not_applied":
        return "failed"
    return "unknown"


def flip_for_undo(verdict: str, phase: str) -> str:
    """Reconcile asks "is the apply in effect?"; for an undo intent the answer is the other way round."""
    if phase == "undo" and verdict in ("applied", "not_applied"):
        return "not_applied" if verdict == "applied" else "applied"
    return verdict


def planned_after(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What the device would read if the planned apply took effect: undo compares against it
    (a cap is restored only if the limit is still the one we set; a drain resumed only with our marker)."""
    after: dict[str, Any] = {}
    if "want_watts" in plan:
        after["limit_watts"] = plan["want_watts"]
    if "reason" in plan:
        after["reason"] = plan["reason"]
    return after


def carry_ownership(plan: dict[str, Any], first_intent: Any) -> dict[str, Any]:
    """A step re-run after a crash finds its own earlier effect (the cap at its value, the node drained
    with our marker) and would call it "not ours"; the first intent's record of what was there before,
    and that it was ours, wins, so the effect is held and undone like any other."""
    if first_intent is None:
        return plan
    before = first_intent.detail.get("plan", {}).get("before", {})
    if before.get("owned") and not plan.get("before", {}).get("owned"):
        return {**plan, "before": dict(before), "ownership": "carried from the first intent"}
    return plan


def rebuild_effects(entries: Iterable[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Effects still in place (applied or possibly applied, owned, not undone) from the journal.

    An apply whose result is `unknown` (the device could not be read at reconcile) counts: undo
    checks the device itself before touching it. Only a successful undo (or `kept`) releases one;
    a failed or interrupted undo leaves it to be undone again.
    """
    applied: dict[str, Any] = {}
    reruns: dict[str, list[str]] = {}  # an apply -> its re-runs (a derate re-planned: derate_watch.py)
    for e in entries:
        if e.kind != "result" or not e.action_id:
            continue
        phase = e.detail.get("phase", "apply")
        if phase == "apply" and e.result in ("done", "unknown"):
            applied[e.action_id] = e
            if e.detail.get("rerun_of"):
                reruns.setdefault(e.detail["rerun_of"], []).append(e.action_id)
        elif phase == "apply" and e.result == "failed":
            applied.pop(e.action_id, None)
        elif phase == "undo" and e.result in ("undone", "kept", "released"):  # released: a person took it over
            first = e.detail.get("apply_action_id", "")
            for aid in [first, *reruns.pop(first, [])]:  # the undo ends the apply and every re-run of it
                applied.pop(aid, None)
    effects: dict[tuple[str, str], dict[str, Any]] = {}
    for aid, e in applied.items():
        key = (e.action or "", e.target or "")
        before = e.detail.get("before", {})
        after = e.detail.get("after") or planned_after(e.detail.get("plan", {}))
        eff = effects.get(key)
        first = e.detail.get("rerun_of")
        if first and eff is not None and eff["holders"].get(e.incident_id) == first:
            if not e.detail.get("skipped"):
                eff["after"] = after  # a re-run of this incident's apply: its value now, the first one's `before`
            continue
        if eff is None or (before.get("owned") and not eff["before"].get("owned")):
            holders = eff["holders"] if eff else {}
            eff = effects[key] = {"before": before, "after": after, "params": e.detail.get("params", {}),
                                  "holders": holders, "playbooks": eff["playbooks"] if eff else {}}
        elif not e.detail.get("skipped"):
            eff["after"] = after  # another incident's value over the first's (a lower cap), as the engine holds it
        eff["holders"][e.incident_id] = first or aid  # a re-run holds under its first apply's id, as in the engine
        eff["playbooks"][e.incident_id] = e.playbook
    return {k: v for k, v in effects.items() if v["before"].get("owned")}
