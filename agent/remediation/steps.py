"""A playbook's steps as a small dependency graph, and the truthful outcome of running them.

Why a graph: a leak response must not wait behind a GPU driver. Every step starts at once, in
the order the playbook lists them (physical urgency), except those that name earlier steps in
`after:`, which wait for them. Why an outcome function: "mitigated" is a claim operators act on;
it is made only when every required step's effect was read back on every target.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Awaitable, Callable, Sequence

from .playbooks import Step

# Step results whose effect was read back: applied now, found already in place, or done before a restart.
REACHED = frozenset({"done", "duplicate"})
OUTCOMES = ("mitigated", "partial", "failed", "observed")


async def run_graph(steps: Sequence[Step], run_one: Callable[[int, Step], Awaitable[list[str]]]) -> list[list[str]]:
    """Run every step as its own task (started in list order); `after` waits for the named steps to finish.

    A step that raises ends as ["failed"] on its own: its exception never cancels the other steps (a leak's
    GPU caps must not depend on its drain's bookkeeping). `run_one` records the failure it can name; this is
    the last line for one it could not."""
    ids = {s.id: i for i, s in enumerate(steps) if s.id}
    tasks: list[asyncio.Task] = []

    async def one(i: int, step: Step) -> list[str]:
        if step.after:
            await asyncio.gather(*(tasks[ids[d]] for d in step.after), return_exceptions=True)
        return await run_one(i, step)

    for i, step in enumerate(steps):
        tasks.append(asyncio.get_running_loop().create_task(one(i, step)))
    try:
        done = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
    for r in done:
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r  # cancellation of the playbook itself (the agent stops)
    return [["failed"] if isinstance(r, Exception) else r for r in done]


def outcome(steps: Sequence[Step], results: Sequence[Sequence[str]], mode: str) -> str:
    """mitigated | partial | failed | observed, from each step's per-target results.

    observed: observe or dry-run mode, or nothing here to act on (no required step had a target);
    mitigated: every required result reached (read back); partial: some did; failed: none did.
    """
    if mode != "enforce":
        return "observed"
    required = [r for step, rs in zip(steps, results) if step.required for r in rs]
    if not required:
        return "observed"
    reached = sum(1 for r in required if r in REACHED)
    if reached == len(required):
        return "mitigated"
    return "partial" if reached else "failed"


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def action_id(incident_id: str, step: int, target: str, phase: str = "apply") -> str:
    return hashlib.sha1(f"{incident_id}|{step}|{target}|{phase}".encode()).hexdigest()[:16]
