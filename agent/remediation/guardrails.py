"""Guardrails: each check returns None (allowed) or the name of the guardrail that blocks.

Why names: every block is journaled and counted in
`supernode_remediation_blocked_total{guardrail}`, so "why did the agent not
act" is answered by a label, not by reading logs. Blast radius is counted
from the scheduler's own node states, not from the agent's memory.

Why reservations: a step awaits between passing the guardrails and acting
(the scheduler's answer, its plan, a person's approval, its intent reaching
the disk), and other steps are checked meanwhile. A step that passed holds a
`Reservation` until it ends: every counting check counts it as already taken
(hourly rate, breaker window, and its node among the drained), so steps
checked together pass a limit one at a time, as if they had run in turn.
Cooldown is not one of them: it is about flapping, not how many, and steps
on one target at once are one effect with several holders (engine._hold).
An applied step's reservation becomes a recorded action; one that never
acted (blocked at the write, plan failed, not approved, dry-run) is given back.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Callable

from .settings import Guardrails as GuardrailSettings

# Whose clock: holds, cooldowns, rate windows and the breaker window measure elapsed time, so a wall-clock
# step (NTP, a person setting the date) must neither release nor extend them.
MONOTONIC = time.monotonic


class Guardrails:
    def __init__(self, settings: GuardrailSettings, clock: Callable[[], float] = MONOTONIC):
        self.s = settings
        self.clock = clock
        self.recent: deque[float] = deque()  # action times, for the breaker
        self.per_kind: dict[str, deque[float]] = {}
        self.last_by_target: dict[tuple[str, str], float] = {}
        self.breaker_open = False
        self.in_flight: list[Reservation] = []  # passed, not yet acted or given back
        self.draining: Counter[str] = Counter()  # nodes whose drain passed blast radius and has not ended

    # -- reservations --------------------------------------------------------------

    def reserve(self, kind: str, target: str) -> "Reservation":
        """Hold a place for one step that passed check_breaker, check_rate and check_cooldown just now
        (no await in between: that is what makes check-and-hold one step)."""
        held = Reservation(self, kind, target)
        self.in_flight.append(held)
        return held

    # -- checks ------------------------------------------------------------------

    def _in_window(self) -> int:
        now = self.clock()
        return sum(1 for t in self.recent if now - t <= self.s.breaker_window_seconds)

    def check_breaker(self) -> str | None:
        """Open, or the actions in the window plus the steps in flight already fill it (the step would be
        one more than breaker_max_actions once they are recorded)."""
        if self.breaker_open:
            return "circuit_breaker"
        if self.in_flight and self._in_window() + len(self.in_flight) >= self.s.breaker_max_actions:
            return "circuit_breaker"
        return None

    def check_rate(self, kind: str) -> str | None:
        limit = self.s.rate_per_hour.get(kind, self.s.rate_per_hour.get("default", 60))
        q = self.per_kind.get(kind, deque())
        now = self.clock()
        while q and now - q[0] > 3600:
            q.popleft()
        in_flight = sum(1 for r in self.in_flight if r.kind == kind)
        return "rate_limit" if len(q) + in_flight >= limit else None

    def check_cooldown(self, kind: str, target: str) -> str | None:
        last = self.last_by_target.get((kind, target))
        if last is not None and self.clock() - last < self.s.cooldown_seconds:
            return "cooldown"
        return None

    def check_blast_radius(self, drained: list[str], rack_nodes: int, node: str) -> tuple[str, str] | None:
        """(guardrail, why) when draining `node` would take too much of the rack out, else None.

        drained: the rack's nodes the scheduler shows drained/down (not `node` itself), named so the
        journal says which nodes were counted; rack_nodes: the rack's size (the inventory). Drains of
        this agent that passed and have not ended count too: the scheduler shows them only once they act.
        """
        in_flight = sorted(set(self.draining) - set(drained) - {node})
        drained = sorted(set(drained) | set(in_flight))
        after = len(drained) + 1
        counted = ", ".join(f"{n} (in progress here)" if n in in_flight else n for n in drained) or "none"
        if after > self.s.max_drained_nodes:
            return "blast_radius", (f"draining {node} would make {after} of the rack's nodes out of service "
                                    f"(drained now: {counted}); max_drained_nodes is {self.s.max_drained_nodes}")
        if rack_nodes > 0 and after / rack_nodes > self.s.max_drained_fraction + 1e-9:
            return "blast_radius", (f"draining {node} would take {after}/{rack_nodes} of the rack out of service "
                                    f"(drained now: {counted}); max_drained_fraction is {self.s.max_drained_fraction}")
        return None

    def why(self, guardrail: str, kind: str, target: str) -> str:
        """The words for a block by rate, cooldown or breaker: what limit, and how to get past it."""
        s = self.s
        if guardrail == "circuit_breaker" and not self.breaker_open:
            return (f"circuit breaker: {self._in_window()} actions within {s.breaker_window_seconds:g} s and "
                    f"{len(self.in_flight)} under way reach breaker_max_actions ({s.breaker_max_actions}); "
                    "the breaker opens as they act")
        if guardrail == "circuit_breaker":
            return (f"circuit breaker open: {s.breaker_max_actions} actions within {s.breaker_window_seconds:g} s; "
                    "a person resets it (POST /api/v1/breaker/reset with the admin token)")
        if guardrail == "rate_limit":
            limit = s.rate_per_hour.get(kind, s.rate_per_hour.get("default", 60))
            return f"rate limit: {limit} {kind} actions per hour already taken (those under way included)"
        if guardrail == "cooldown":
            return f"cooldown: {kind} on {target} ran less than {s.cooldown_seconds:g} s ago"
        return guardrail

    def needs_approval(self, key: str | None) -> bool:
        return key is not None and (key == "always" or key not in self.s.automatic)

    # -- bookkeeping -------------------------------------------------------------

    def record(self, kind: str, target: str) -> None:
        """Count one applied action; trips the breaker when too many fall within the window."""
        now = self.clock()
        self.per_kind.setdefault(kind, deque()).append(now)
        self.last_by_target[(kind, target)] = now
        self.recent.append(now)
        while self.recent and now - self.recent[0] > self.s.breaker_window_seconds:
            self.recent.popleft()
        if len(self.recent) >= self.s.breaker_max_actions and not self.breaker_open:
            self.breaker_open = True

    def reset_breaker(self) -> bool:
        was = self.breaker_open
        self.breaker_open = False
        self.recent.clear()
        return was


class Reservation:
    """One step's place in the guardrails, from passing them until it ends (see the module's docstring)."""

    def __init__(self, guard: Guardrails, kind: str, target: str):
        self.guard = guard
        self.kind = kind
        self.target = target
        self.drain: str | None = None

    def hold_drain(self, node: str) -> None:
        """Count `node` as drained for every blast-radius check until this step ends (called in the same
        step as the check that allowed it)."""
        if self.drain is None:
            self.drain = node
            self.guard.draining[node] += 1

    def commit(self) -> None:
        """The step acted (whatever the device answered): record it as an applied action."""
        if self in self.guard.in_flight:
            self.guard.in_flight.remove(self)
            self.guard.record(self.kind, self.target)

    def release(self) -> None:
        """The step ended: give back what it did not use. Idempotent."""
        if self in self.guard.in_flight:
            self.guard.in_flight.remove(self)
        if self.drain is not None:
            self.guard.draining[self.drain] -= 1
            if self.guard.draining[self.drain] <= 0:
                del self.guard.draining[self.drain]
            self.drain = None
