"""The leak response is not behind any driver: steps start at once in urgency order, NVML calls time out
on their own pool. The GPU is the simulator's NVML twin (real HTTP peer) with its per-GPU hang fault;
a whole-driver hang of nvmlDeviceGetCount is a twin subclass whose count blocks until released."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.remediation.actions.slurm import SimulatedScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.playbooks import Playbook, Step
from agent.remediation.settings import RemediationSettings
from agent.remediation.steps import run_graph
from agent.sim.nvml_faults import set_hang
from agent.sim.nvml_twin import NvmlTwin
from agent.sim.rack import RackModel

from helpers import await_for
from remediation_support import identity, inventory, nvml_twin_server, results

OUTCOMES = ("mitigated", "partial", "failed", "observed")


class CountHangs(NvmlTwin):
    """The driver hangs in nvmlDeviceGetCount (as a wedged driver does) until `release` is set."""

    release = threading.Event()

    def nvmlDeviceGetCount(self) -> int:
        self.release.wait(60)
        return super().nvmlDeviceGetCount()


async def leak_engine(tmp_path, twin: type[NvmlTwin], gpus: int):
    """A started engine on a 2x2 simulated rack's NVML twin (real HTTP peer) and a simulated scheduler."""
    model = RackModel(nodes=2, gpus_per_node=2)
    runner, url = await nvml_twin_server(model)
    lib = twin(url, "node01")
    await asyncio.to_thread(lib.nvmlInit)
    sched = SimulatedScheduler(["node01", "node02"])
    s = RemediationSettings.model_validate({"device_timeout_seconds": 0.5, "guardrails": {
        "cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "max_drained_fraction": 1.0}})
    eng = RemediationEngine(s, "enforce", identity(), inventory(gpus=gpus), tmp_path / "journal.db",
                            Executors(scheduler=sched, gpu_libs={"node01": lib}))
    await eng.start()
    return eng, sched, model, lib, runner


def test_leak_drains_while_the_gpu_driver_hangs_in_device_count(tmp_path):
    async def main():
        # count from NVML (the default inventory)
        eng, sched, model, lib, runner = await leak_engine(tmp_path, CountHangs, gpus=0)
        try:
            inc = eng.fire("leak", {"zone": "zone-a"}, "critical")
            await await_for(lambda: sched.nodes["node01"].drained, what="drained with NVML hung")
            assert not CountHangs.release.is_set()  # NVML never answered: the drain did not wait for it
            assert any(t.name.startswith("calls-nvml") for t in threading.enumerate())  # its own pool
            await await_for(lambda: inc.state in OUTCOMES, what="outcome")
            cap = results(eng, kind="result", action="gpu_power_cap")
            assert [r.result for r in cap] == ["failed"] and "did not answer" in cap[0].detail["error"]
            assert inc.state == "partial" and inc.mitigated_at is None  # the cap is required: not mitigated
        finally:
            CountHangs.release.set()
            await eng.stop()
            await runner.cleanup()
    asyncio.run(main())


def test_one_hung_gpu_fails_its_own_cap_only(tmp_path):
    async def main():
        eng, sched, model, lib, runner = await leak_engine(tmp_path, NvmlTwin, gpus=2)
        set_hang(model, "node01", 1, 30)
        try:
            inc = eng.fire("leak", {"zone": "zone-a"}, "critical")
            await await_for(lambda: inc.state in OUTCOMES, timeout=20, what="outcome")
            assert sched.nodes["node01"].drained
            cap = {r.target: r.result for r in results(eng, kind="result", action="gpu_power_cap")}
            assert cap == {"gpu=0,node=node01": "done", "gpu=1,node=node01": "failed"}
            assert model.gpu("node01", 0).power_limit_mw == model.gpu("node01", 0).min_limit_mw
            assert inc.state == "partial"
            assert inc.as_dict()["state"] == "partial" and inc.detail["steps"]["3:gpu_power_cap"] == ["done", "failed"]
        finally:
            set_hang(model, "node01", 1, 0)
            lib.nvmlShutdown()
            await eng.stop()
            await runner.cleanup()
    asyncio.run(main())


def test_steps_start_at_once_in_order_and_after_waits():
    book = Playbook.model_validate({"name": "p", "trigger": {"detector": "d"}, "steps": [
        {"id": "slow", "action": "gpu_power_cap"}, {"action": "drain", "after": ["slow"]}, {"action": "notify"}]})
    events: list[str] = []

    async def main():
        gate = asyncio.Event()

        async def run_one(i: int, step: Step) -> list[str]:
            events.append(f"start {step.action}")
            if i == 0:
                await gate.wait()
            if i == 2:
                gate.set()  # the independent step ran while the first was still waiting
            events.append(f"end {step.action}")
            return ["done"]

        return await run_graph(book.steps, run_one)

    assert asyncio.run(main()) == [["done"]] * 3
    assert events.index("start notify") < events.index("end gpu_power_cap") < events.index("start drain")
    with pytest.raises(ValueError, match=r"steps.0.after: 'later' is not the id of an earlier step"):
        Playbook.model_validate({"name": "p", "trigger": {"detector": "d"}, "steps": [
            {"action": "drain", "after": ["later"]}, {"id": "later", "action": "notify"}]})


def test_leak_response_undo_keeps_caps_until_the_resume_was_approved():
    from agent.remediation.playbooks import load_playbooks

    leak = next(b for b in load_playbooks() if b.name == "leak-response")
    actions = [leak.steps[i].action for i in leak.undo_sequence()]
    # applied drain-first (urgency); undone valve and resume (both need a person) before the caps lift
    assert [s.action for s in leak.steps][0] == "drain"
    assert actions.index("cdu_write") < actions.index("drain") < actions.index("gpu_power_cap")
    with pytest.raises(ValueError, match="cycle"):
        Playbook.model_validate({"name": "p", "trigger": {"detector": "d"}, "steps": [
            {"id": "a", "action": "drain", "undo_after": ["b"]}, {"id": "b", "action": "notify", "undo_after": ["a"]}]})
