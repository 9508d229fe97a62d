"""The leak response is not behind any driver: steps start at once in urgency order, NVML calls time out
on their own pool. The GPU is the simulator's NVML twin (real HTTP peer) with its per-GPU hang fault;
a whole-driver hang of nvmlDeviceGetCount is a twin subclass whose count blocks until released."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from sim.scheduler import SimulatedScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.playbooks import Playbook, Step
from agent.remediation.settings import RemediationSettings
from agent.remediation.steps import run_graph
from sim.nvml_faults import set_hang
from sim.nvml_twin import NvmlTwin
from sim.rack import RackModel

from tests.helpers import await_for
from tests.remediation_support import identity, inventory, nvml_twin_server, results

OUTCOMES = ("mitigated", "partial", "failed", "observed")


class CountHangs(NvmlTwin):
    """The driver hangs in nvmlDeviceGetCount (as a wedged driver does) until `release` is set."""

    release = threading.Event()

    def nvmlDeviceGetCount(self) -> int:
        self.release.wait(60)
        return super().nvmlDeviceGetCount()


@contextlib.asynccontextmanager
async def leak_engine(tmp_path, twin: type[NvmlTwin], gpus: int, hung_gpu: int | None = None):
    """A started engine on a 2x2 simulated rack's NVML twin (real HTTP peer) and a simulated scheduler;
    `hung_gpu`: every NVML call on node01's GPU of that index blocks (the twin's per-GPU hang) until the end."""
    CountHangs.release.clear()
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
    if hung_gpu is not None:
        set_hang(model, "node01", hung_gpu, 60)
    try:
        yield eng, sched, model, lib
    finally:
        if hung_gpu is not None:
            set_hang(model, "node01", hung_gpu, 0)
        CountHangs.release.set()  # ends CountHangs' blocked count
        lib.nvmlShutdown()  # ends the twin's simulated hangs
        await eng.stop()
        await runner.cleanup()


def test_leak_drains_while_the_gpu_driver_hangs_in_device_count(tmp_path):
    async def main():
        # count from NVML (the default inventory)
        async with leak_engine(tmp_path, CountHangs, gpus=0) as (eng, sched, model, lib):
            inc = eng.fire("leak", {"zone": "zone-a"}, "critical")
            await await_for(lambda: sched.nodes["node01"].drained, what="drained with NVML hung")
            assert not CountHangs.release.is_set()  # NVML never answered: the drain did not wait for it
            assert any(t.name.startswith("calls-nvml") for t in threading.enumerate())  # its own pool
            await await_for(lambda: inc.state in OUTCOMES, what="outcome")
            cap = results(eng, kind="result", action="gpu_power_cap")
            assert [r.result for r in cap] == ["failed"] and "did not answer" in cap[0].detail["error"]
            assert inc.state == "partial" and inc.mitigated_at is None  # the cap is required: not mitigated
    asyncio.run(main())


def test_one_hung_gpu_fails_its_own_cap_only(tmp_path):
    async def main():
        async with leak_engine(tmp_path, NvmlTwin, gpus=2, hung_gpu=1) as (eng, sched, model, lib):
            inc = eng.fire("leak", {"zone": "zone-a"}, "critical")
            await await_for(lambda: inc.state in OUTCOMES, timeout=20, what="outcome")
            assert sched.nodes["node01"].drained
            cap = {r.target: r.result for r in results(eng, kind="result", action="gpu_power_cap")}
            assert cap == {"gpu=0,node=node01": "done", "gpu=1,node=node01": "failed"}
            assert model.gpu("node01", 0).power_limit_mw == model.gpu("node01", 0).min_limit_mw
            assert inc.state == "partial"
            assert inc.as_dict()["state"] == "partial" and inc.detail["steps"]["3:gpu_power_cap"] == ["done", "failed"]
    asyncio.run(main())


def test_a_hung_gpu_holds_one_nvml_thread_however_often_it_is_capped(tmp_path):
    """More cap attempts on the hung GPU than NVML's pool has threads: the healthy GPU is still capped."""
    from agent.remediation.calls import NVML

    async def main():
        async with leak_engine(tmp_path, NvmlTwin, gpus=2, hung_gpu=1) as (eng, sched, model, lib):
            for _ in range(6):  # the pool has 4 threads
                inc = eng.fire("gpu_thermal", {"node": "node01", "gpu": "1"}, "warning")
                await await_for(lambda: inc.state in OUTCOMES, what="hung GPU's cap outcome")
                assert inc.state == "failed"
                eng.clear("gpu_thermal", {"node": "node01", "gpu": "1"})
            errors = [r.detail["error"] for r in results(eng, kind="result", action="gpu_power_cap")]
            assert len(errors) == 6 and all("still hung" in e for e in errors)  # refused at once after the first
            assert NVML._stuck[(id(lib), 1)] == 1  # one thread held by the hung GPU, not one per attempt
            ok = eng.fire("gpu_thermal", {"node": "node01", "gpu": "0"}, "warning")
            await await_for(lambda: ok.state in OUTCOMES, what="healthy GPU's cap outcome")
            assert ok.state == "mitigated" and model.gpu("node01", 0).power_limit_mw == 525_000
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
