"""A step's guardrails, intent and device write hold together while other steps run on the loop.

Two properties, each shown with the loop interleaving forced (a scheduler whose answer waits on the test,
a journal file another connection holds locked) rather than hoped for:

- Steps checked at the same time pass a counting limit (blast radius, hourly rate, breaker) one at a
  time: the first to pass holds its place, and the others count it.
- A step writes to its device only once its intent is committed, so a crash mid-write leaves an intent
  for the restart to reconcile; a disk that does not commit delays the step by a bound, never stops it.

The real-Slurm form of the first is tests/test_slurm_drain.py, the killed-process form of the second
tests/test_remediation_devices.py::test_sigkill_between_power_cap_intent_and_result.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import AsyncIterator

import pytest

from agent.remediation.actions.slurm import NodeState
from sim.scheduler import SimulatedScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.settings import RemediationSettings

from tests.helpers import await_for
from tests.remediation_support import engine, identity, inventory, results

NODES = ("node01", "node02", "node03", "node04")


class GatedScheduler(SimulatedScheduler):
    """Its node list is answered only once the test opens the gate, as a real `sinfo` takes its time; its
    drain hands the loop on once before it takes effect, as a real `scontrol` (a subprocess) does."""

    def __init__(self, nodes: list[str]):
        super().__init__(nodes)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def list(self, nodes: list[str] | None = None) -> dict[str, NodeState]:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        return await super().list(nodes)

    async def drain(self, node: str, reason: str) -> None:
        await asyncio.sleep(0)  # the await of the subprocess: the other step's turn, not a wait for it
        await super().drain(node, reason)


class WitnessScheduler(SimulatedScheduler):
    """Reads, at each drain, which intents the journal file holds on disk (a reader of its own)."""

    def __init__(self, nodes: list[str], journal: Path):
        super().__init__(nodes)
        self.journal = journal
        self.intents_on_disk_at_drain: list[list[str]] = []

    async def drain(self, node: str, reason: str) -> None:
        db = sqlite3.connect(f"file:{self.journal}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT target FROM journal WHERE kind = 'intent' ORDER BY seq").fetchall()
        finally:
            db.close()
        self.intents_on_disk_at_drain.append([r[0] for r in rows])
        await super().drain(node, reason)


def _fire(eng: RemediationEngine, node: str):
    source = "local" if node == eng.identity.node else "alertmanager"
    return eng.fire("gpu_lost", {"node": node}, "critical", source=source)


@pytest.mark.parametrize("guard, guardrail", [
    ({"max_drained_nodes": 1, "max_drained_fraction": 1.0}, "blast_radius"),
    ({"rate_per_hour": {"drain": 1, "default": 60}, "max_drained_nodes": 4, "max_drained_fraction": 1.0},
     "rate_limit"),
    ({"breaker_max_actions": 1, "max_drained_nodes": 4, "max_drained_fraction": 1.0}, "circuit_breaker"),
])
def test_two_drains_checked_together_pass_a_limit_of_one_once(tmp_path, guard, guardrail):
    async def main():
        sched = GatedScheduler(list(NODES))
        eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inventory(nodes=NODES), **guard)
        await eng.start()
        a, b = _fire(eng, "node01"), _fire(eng, "node02")
        # both steps are past their first checks and waiting on the scheduler, or the second was refused
        # already because the first holds its place: either way, now let the scheduler answer
        await await_for(lambda: sched.waiting == 2 or b.state == "failed", what="both drains checked")
        sched.gate.set()
        await await_for(lambda: {a.state, b.state} <= {"mitigated", "failed"}, what="both steps ended")
        assert {a.state, b.state} == {"mitigated", "failed"}
        assert len([n for n, st in sched.nodes.items() if st.drained]) == 1
        assert [e.detail["guardrail"] for e in results(eng, kind="blocked", action="drain")] == [guardrail]
        assert not eng.guard.in_flight and not eng.guard.draining  # every place given back or recorded
        await eng.stop()
    asyncio.run(main())


def test_a_step_refused_after_its_place_was_held_gives_it_back(tmp_path):
    """A drain that passes blast radius but is then refused (its plan finds the node unknown) must not go on
    counting: the next incident's drain passes the same limit of one."""
    async def main():
        sched = SimulatedScheduler(list(NODES))
        eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inventory(nodes=NODES + ("node05",)),
                     max_drained_nodes=1, max_drained_fraction=1.0)
        await eng.start()
        a = _fire(eng, "node05")  # in the inventory, unknown to the scheduler: the plan fails
        await await_for(lambda: a.state == "failed", what="the unknown node's drain failed")
        assert not eng.guard.in_flight and not eng.guard.draining
        b = _fire(eng, "node02")
        await await_for(lambda: b.state == "mitigated", what="the next drain passed")
        assert sched.nodes["node02"].drained
        await eng.stop()
    asyncio.run(main())


def _witness_engine(tmp_path: Path, wait: float) -> tuple[RemediationEngine, WitnessScheduler]:
    sched = WitnessScheduler(list(NODES), tmp_path / "journal.db")
    settings = RemediationSettings.model_validate({
        "intent_commit_wait_seconds": wait,
        "guardrails": {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "max_drained_nodes": 4,
                       "max_drained_fraction": 1.0}})
    eng = RemediationEngine(settings, "enforce", identity("enforce"), inventory(nodes=NODES), tmp_path / "journal.db",
                            Executors(scheduler=sched))
    return eng, sched


@contextlib.asynccontextmanager
async def journal_held_by_another_writer(eng: RemediationEngine) -> AsyncIterator[None]:
    """Start the engine, let its first rows land, then hold its journal file locked from another connection:
    the agent's commits wait for it (the busy timeout, then retries) until the block ends."""
    await eng.start()
    assert await asyncio.to_thread(eng.journal.flush)
    db = sqlite3.connect(str(eng.journal.path), isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def test_a_step_writes_to_the_device_only_once_its_intent_is_on_disk(tmp_path):
    async def main():
        eng, sched = _witness_engine(tmp_path, wait=120)
        async with journal_held_by_another_writer(eng):
            inc = _fire(eng, "node01")
            await await_for(lambda: eng.journal.commit_waits == 1, what="the step waiting for its intent's commit")
            assert not sched.nodes["node01"].drained and sched.intents_on_disk_at_drain == []
        await await_for(lambda: inc.state == "mitigated", timeout=30, what="drained once the intent landed")
        assert sched.intents_on_disk_at_drain == [["node=node01"]]
        (done,) = results(eng, kind="result", action="drain")
        assert done.result == "done" and done.detail["intent_on_disk"] is True
        await eng.stop()
    asyncio.run(main())


def test_a_disk_that_does_not_commit_delays_a_step_by_its_bound_and_no_more(tmp_path):
    async def main():
        eng, sched = _witness_engine(tmp_path, wait=0.2)
        async with journal_held_by_another_writer(eng):
            a = _fire(eng, "node01")
            await await_for(lambda: a.state == "mitigated", timeout=30, what="drained with the disk held")
            assert sched.intents_on_disk_at_drain == [[]]
            (done,) = results(eng, kind="result", action="drain")
            assert done.detail["intent_on_disk"] is False
            # the bound was spent once: later steps act at once until the disk commits again
            seq = eng.journal.append("intent", action_id="probe", detail={})
            assert await asyncio.wait_for(eng.journal.committed(seq, 3600), timeout=30) is False
            b = _fire(eng, "node02")
            await await_for(lambda: b.state == "mitigated", timeout=30, what="second drain with the disk held")
            assert eng.journal.pending > 0  # nothing reached the disk meanwhile
        assert await asyncio.to_thread(eng.journal.flush, 30)
        db = sqlite3.connect(f"file:{tmp_path / 'journal.db'}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT kind, target, result FROM journal WHERE action = 'drain'").fetchall()
        finally:
            db.close()
        assert sorted(rows) == [("intent", "node=node01", None), ("intent", "node=node02", None),
                                ("result", "node=node01", "done"), ("result", "node=node02", "done")]
        seq = eng.journal.append("engine", result="probe")
        assert await eng.journal.committed(seq, 30) is True  # committing again: waits are back
        await eng.stop()
    asyncio.run(main())
