"""Blast radius of a drain, counted on the rack's own nodes, and the scheduler's answer when it has none.

Why apart: the count must come from the scheduler (a person's drain counts
as much as ours), but only for the rack's inventory nodes (`sinfo -n`):
three drained nodes on another rack must not stop a leak drain here. A
scheduler that cannot answer is a block with its own reason
(`scheduler_unreachable`), retried by the engine, never an exception that
ends the playbook part-way.
"""

from __future__ import annotations

from typing import Any, Sequence

from .actions.slurm import SchedulerError
from .guardrails import Guardrails, Reservation

SCHEDULER_UNREACHABLE = "scheduler_unreachable"


async def check_drain(scheduler: Any, guard: Guardrails, rack_nodes: Sequence[str], node: str,
                      rack: Any = None, held: Reservation | None = None) -> tuple[str, str] | None:
    """(guardrail, why) if draining `node` is blocked; None if allowed (or the node is already out).

    `rack` (agent.coordination): with etcd, the count also holds the drains other agents are making at
    this moment, and the decision is reserved atomically, so racing agents never pass the limit together.
    `held`: the step's reservation; an allowed drain is counted in it before anything else runs on the loop,
    so this agent's own steps checked meanwhile count it too."""
    try:
        states = await scheduler.list(list(rack_nodes) or None)
    except SchedulerError as exc:
        return SCHEDULER_UNREACHABLE, f"cannot count the rack's drained nodes: {exc}"
    if states.get(node) is not None and states[node].drained:
        return None  # already out: draining it again changes nothing
    drained = [n for n, st in states.items() if st.drained and n != node]
    # Without an inventory node list the scheduler's whole answer is the "rack" (documented fallback).
    if rack is not None:
        blocked = await rack.check_drain(node, drained, len(rack_nodes) or len(states), guard)
    else:
        blocked = guard.check_blast_radius(drained, len(rack_nodes) or len(states), node)
    if blocked is None and held is not None:
        held.hold_drain(node)
    return blocked
