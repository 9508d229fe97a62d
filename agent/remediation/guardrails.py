"""Guardrails: each check returns None (allowed) or the name of the guardrail that blocks.

Why names: every block is journaled and counted in
`supernode_remediation_blocked_total{guardrail}`, so "why did the agent not
act" is answered by a label, not by reading logs. Blast radius is counted
from the scheduler's own node states, not from the agent's memory.
"""

from __future__ import annotations

import time
from collections import deque
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
        self.breaker_opened_at: float | None = None

    # -- checks ------------------------------------------------------------------

    def check_breaker(self) -> str | None:
        return "circuit_breaker" if self.breaker_open else None

    def check_rate(self, kind: str) -> str | None:
        limit = self.s.rate_per_hour.get(kind, self.s.rate_per_hour.get("default", 60))
        q = self.per_kind.get(kind, deque())
        now = self.clock()
        while q and now - q[0] > 3600:
            q.popleft()
        return "rate_limit" if len(q) >= limit else None

    def check_cooldown(self, kind: str, target: str) -> str | None:
        last = self.last_by_target.get((kind, target))
        if last is not None and self.clock() - last < self.s.cooldown_seconds:
            return "cooldown"
        return None

    def check_blast_radius(self, drained: list[str], rack_nodes: int, node: str) -> tuple[str, str] | None:
        """(guardrail, why) when draining `node` would take too much of the rack out, else None.

        drained: the rack's nodes the scheduler shows drained/down (not `node` itself), named so the
        journal says which nodes were counted; rack_nodes: the rack's size (the inventory).
        """
        after = len(drained) + 1
        counted = ", ".join(sorted(drained)) or "none"
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
        if guardrail == "circuit_breaker":
            return (f"circuit breaker open: {s.breaker_max_actions} actions within {s.breaker_window_seconds:g} s; "
                    "a person resets it (POST /api/v1/breaker/reset with the admin token)")
        if guardrail == "rate_limit":
            limit = s.rate_per_hour.get(kind, s.rate_per_hour.get("default", 60))
            return f"rate limit: {limit} {kind} actions per hour already taken"
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
            self.breaker_opened_at = now

    def reset_breaker(self) -> bool:
        was = self.breaker_open
        self.breaker_open = False
        self.breaker_opened_at = None
        self.recent.clear()
        return was
