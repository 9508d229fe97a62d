"""Reconcile keeps ownership: an unreadable device at start stays `unknown`, is re-checked until it answers,
and the effect is still undone; a step re-run after a crash keeps the ownership its first intent recorded."""

from __future__ import annotations

import asyncio

from agent.remediation.actions.slurm import SchedulerError
from sim.scheduler import SimulatedScheduler
from agent.remediation.engine import Executors

from tests.helpers import await_for
from tests.remediation_support import engine, results

OUTCOMES = ("mitigated", "partial", "failed", "observed")


class Flaky(SimulatedScheduler):
    """Slurm that can be unreachable (reads fail) or hang inside a drain after it took effect (a crash point)."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.unreachable = False
        self.hang_after_drain = False

    async def state(self, node):
        if self.unreachable:
            raise SchedulerError("slurmctld: connection refused")
        return await super().state(node)

    async def drain(self, node, reason):
        await super().drain(node, reason)
        if self.hang_after_drain:
            await asyncio.Event().wait()  # the "crash": cancelled before the result is journaled


async def crashed_after_drain(tmp_path, sched: Flaky) -> str:
    """Run an engine until the drain took effect, then drop it without a result row (as a SIGKILL would)."""
    sched.hang_after_drain = True
    eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
    await eng.start()
    inc = eng.fire("gpu_lost", {"node": "node01"}, "critical")
    await await_for(lambda: sched.nodes["node01"].drained, what="drain in effect")
    await eng.stop()  # cancels the hung step: intent without result, like a crash
    sched.hang_after_drain = False
    return inc.id


def test_unreadable_scheduler_at_start_stays_unknown_then_the_drain_is_still_undone(tmp_path):
    async def main():
        sched = Flaky(["node01", "node02"])
        iid = await crashed_after_drain(tmp_path, sched)
        sched.unreachable = True
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        eng.unknown_recheck_seconds = 0.05
        await eng.start()
        rows = results(eng, kind="result", action="drain")
        assert [r.result for r in rows] == ["unknown"]  # not "failed": it may well be ours and in place
        inc = eng.incidents.get(iid)
        assert inc is not None and inc.state == "mitigating"  # waits for the device, does not act blind
        sched.unreachable = False  # Slurm answers again
        await await_for(lambda: inc.state in OUTCOMES, what="outcome once Slurm answers")
        assert [r.result for r in results(eng, kind="result", action="drain")] == ["unknown", "done"]
        assert inc.state == "mitigated"
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: not sched.nodes["node01"].drained, what="our drain undone")
        await eng.stop()
    asyncio.run(main())


def test_a_step_re_run_after_a_crash_keeps_the_ownership_of_its_first_intent(tmp_path):
    async def main():
        sched = Flaky(["node01", "node02"])
        iid = await crashed_after_drain(tmp_path, sched)
        # the journal lost the drain's outcome: the restart reads "failed" from an older agent, as issue 10 saw
        eng = engine(tmp_path, executors=Executors(scheduler=sched), max_drained_fraction=1.0)
        intent = eng.journal.unfinished_intents()[0]
        eng.journal.append("result", action_id=intent.action_id, incident_id=iid, playbook=intent.playbook,
                           action="drain", target=intent.target, result="failed",
                           detail={"phase": "apply", "reconciled": "unknown (old agent)"})
        await eng.start()
        inc = eng.incidents.get(iid)
        await await_for(lambda: inc.state in OUTCOMES, what="re-run outcome")
        rerun = results(eng, kind="intent", action="drain")[-1]
        assert rerun.detail["plan"]["before"]["owned"] is True  # node found drained, but by us
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: not sched.nodes["node01"].drained, what="our drain undone after the re-run")
        await eng.stop()
    asyncio.run(main())
