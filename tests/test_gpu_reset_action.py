"""The recovery ladder's gpu_reset action (issue 33) against the real twin: a simulated rack in this process,
read over HTTP through the NVML twin as the agent reads it, and reset through the simulator's own CLI
(`python -m sim.cli --sim URL inject gpu-reset ...`), the command the simulator's agent configs carry.

The action runs directly (no engine): what it waits for, what it runs, and what its verification says are
the inputs the engine's step runner journals and the recovery ledger escalates on.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.remediation.actions import ActionError, ActionResult
from agent.remediation.actions.gpu_reset import GpuResetAction, reset_argv
from agent.remediation.gpu_health import check_gpus
from agent.remediation.settings import GpuRecoverySettings
from sim.harness import SimRack, sim_rack
from sim.nvml_twin import NvmlTwin
from tests.helpers import await_for

NODE = "node01"
TARGET = {"node": NODE, "gpu": "1"}  # GPU 1 of 2: GPU 0 is the neighbour a reset must leave alone


class WatchedTwin(NvmlTwin):
    """The twin, counting the process reads the idle wait makes (so a test knows the action is waiting)."""

    process_reads = 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        self.process_reads += 1
        return super().nvmlDeviceGetComputeRunningProcesses(h)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[SimRack, WatchedTwin]]:
    with sim_rack(tmp_path, nodes=1, gpus=2, nvlinks=4, devices=False) as rack:
        twin = WatchedTwin(rack.url, NODE, cache_ttl=0.0)  # every call sees the model as it is now
        twin.nvmlInit()
        try:
            yield rack, twin
        finally:
            rack.clear()  # ends a simulated hang, so no NVML thread stays blocked past the test
            twin.nvmlShutdown()


def action(rack: SimRack, twin: NvmlTwin, command: list[str] | None = None, **settings: Any) -> GpuResetAction:
    s = GpuRecoverySettings(gpu_reset_command=command or rack.gpu_reset_command,
                            **{"idle_wait_seconds": 60.0, "verify_seconds": 10.0, **settings})
    return GpuResetAction({NODE: twin}, s, call_timeout=5.0)


def run(act: GpuResetAction, target: dict[str, str] = TARGET) -> tuple[dict, ActionResult]:
    async def go() -> tuple[dict, ActionResult]:
        plan = await act.plan(target, {}, {})
        return plan, await act.apply(target, {}, {}, plan)
    return asyncio.run(go())


def gpu_state(rack: SimRack, gpu: int) -> dict[str, Any]:
    return rack.sim.state()["nodes"][NODE]["gpus"][gpu]


def resets_run(rack: SimRack) -> list[dict[str, Any]]:
    """The gpu-reset injections the simulator accepted (what the reset command did)."""
    return [f["params"] for f in rack.sim.active_faults if f["kind"] == "gpu-reset"]


def healthy(twin: NvmlTwin, gpu: int) -> bool:
    return check_gpus(twin, 0, [gpu])[0]


def test_the_reset_waits_while_a_process_runs_and_resets_once_the_job_is_gone(rig):
    rack, twin = rig
    for gpu in (0, 1):
        rack.inject("xid", node=NODE, gpu=gpu, code=48, sticky=True)
    assert not healthy(twin, 1)
    act = action(rack, twin)

    async def go() -> tuple[dict, ActionResult]:
        plan = await act.plan(TARGET, {}, {})
        task = asyncio.create_task(act.apply(TARGET, {}, {}, plan))
        await await_for(lambda: twin.process_reads >= 3, timeout=30, what="the reset polling the GPU's processes")
        assert not task.done(), "the reset went ahead (or gave up) while the job's process ran"
        assert not resets_run(rack)
        await asyncio.to_thread(rack.inject, "workload", node=NODE, gpu=1, ratio=0.0)  # the job ends
        return plan, await task

    plan, res = asyncio.run(go())
    assert plan["before"]["processes"] == [40_001]  # the simulated job's process on GPU 1
    assert res.ok and res.after["processes_waited_for"] == [40_001]
    assert resets_run(rack) == [{"node": NODE, "gpu": 1}]
    assert gpu_state(rack, 1)["xid_faults"] == [] and healthy(twin, 1)
    assert [f["code"] for f in gpu_state(rack, 0)["xid_faults"]] == [48], "the neighbour GPU was reset too"


@pytest.mark.parametrize("code", [48, 95])
def test_a_reset_class_fault_is_cleared_and_the_health_read_passes(rig, code):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    rack.inject("xid", node=NODE, gpu=1, code=code, sticky=True)
    assert not healthy(twin, 1), "the sticky fault should ask for a reset before it"
    plan, res = run(action(rack, twin))
    assert res.ok and not res.skipped
    assert res.after["uuid"] == gpu_state(rack, 1)["uuid"] == plan["uuid"]
    assert res.after["processes_waited_for"] == []
    assert "recovery action NONE" in res.after["verify"]
    assert res.after["command"][-4:] == ["--node", NODE, "--gpu", "1"]
    assert gpu_state(rack, 1)["xid_faults"] == []


def test_a_gpu_that_never_goes_idle_fails_the_step_with_the_pids_left(rig):
    rack, twin = rig
    act = action(rack, twin, idle_wait_seconds=1.5)
    with pytest.raises(ActionError) as e:
        run(act)
    assert e.value.permanent  # a retry would wait the whole window again: the ladder escalates instead
    assert "not idle" in str(e.value) and "1 compute process" in str(e.value) and "40001" in str(e.value)
    assert not resets_run(rack)


@pytest.mark.parametrize("fault, params, why", [
    ("recovery-action", {"action": 2}, "recovery action 2"),  # the driver asks for a node reboot
    ("row-remap", {"state": "failed"}, "row remap failed"),  # no spare row: service
])
def test_a_reset_that_does_not_clear_the_fault_fails_so_the_ladder_escalates(rig, fault, params, why):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    rack.inject("xid", node=NODE, gpu=1, code=48, sticky=True)
    rack.inject(fault, node=NODE, gpu=1, **params)
    with pytest.raises(ActionError) as e:
        run(action(rack, twin, verify_seconds=1.5))
    assert str(e.value).startswith("reset did not clear the fault: ") and why in str(e.value)
    assert e.value.permanent
    assert resets_run(rack) == [{"node": NODE, "gpu": 1}], "the reset itself should have run"
    assert gpu_state(rack, 1)["xid_faults"] == [], "the reset-class part is cleared, the rest is not"


def test_a_gpu_off_the_bus_xid_79_is_not_reset(rig):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    rack.inject("xid", node=NODE, gpu=1, code=79, sticky=True)
    with pytest.raises(ActionError) as e:
        run(action(rack, twin))
    assert e.value.permanent and "off the bus" in str(e.value)
    assert gpu_state(rack, 1)["lost"] and not resets_run(rack)


def test_nvml_hung_after_the_reset_fails_the_verification(rig):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    # a "reset" after which the node's driver hangs: the health read must fail the step, not wait on NVML
    hang = [sys.executable, "-m", "sim.cli", "--sim", rack.url, "inject", "nvml-driver-hang", "--node", "{node}",
            "--seconds", "60"]
    act = action(rack, twin, command=hang, verify_seconds=2.0)
    act.timeout = 1.0
    with pytest.raises(ActionError) as e:
        run(act)
    assert str(e.value).startswith("reset did not clear the fault: NVML health read failed")
    assert "did not answer" in str(e.value) or "still hung" in str(e.value)


def test_a_refused_reset_fails_the_step_with_the_programs_own_message(rig):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    wrong = [a.replace("{node}", "node09") for a in rack.gpu_reset_command]  # the simulator knows no node09
    with pytest.raises(ActionError) as e:
        run(action(rack, twin, command=wrong))
    assert "exit 1" in str(e.value) and "'node09' is not a simulated node" in str(e.value)
    assert not e.value.permanent  # a refusal may pass (the driver busy): the step runner tries again


def test_placeholders_are_replaced_inside_each_argument_never_through_a_shell(rig, tmp_path):
    rack, twin = rig
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    echo = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
            "-i", "{gpu}", "--where={node}/{uuid}", "a b;{gpu}", "$(touch x){gpu}", "{other}"]
    plan, res = run(action(rack, twin, command=echo))
    uuid = gpu_state(rack, 1)["uuid"]
    want = ["-i", "1", f"--where={NODE}/{uuid}", "a b;1", "$(touch x)1", "{other}"]
    assert plan["argv"][3:] == want
    assert json.loads(res.after["output"]) == want  # what the program received, one element each


def test_an_unsafe_value_never_reaches_the_reset_command():
    with pytest.raises(ActionError) as e:
        reset_argv(["reset", "--node", "{node}"], {"node": "node01 --all", "gpu": "1"})
    assert e.value.guardrail == "exec_args" and "{node}" in str(e.value)
    assert reset_argv(["reset", "{gpu}"], {"gpu": "1", "node": "x y"}) == ["reset", "1"]  # unused: not checked


def test_after_a_crash_the_health_read_says_whether_the_reset_took_effect(rig):
    rack, twin = rig
    act = action(rack, twin)

    def verdict() -> str:
        return asyncio.run(act.reconcile(TARGET, {}, {}))

    assert verdict() == "applied"
    rack.inject("xid", node=NODE, gpu=1, code=48, sticky=True)
    assert verdict() == "not_applied"
    act.timeout = 1.0
    rack.inject("nvml-driver-hang", node=NODE, seconds=60)
    assert verdict() == "unknown"


def test_the_simulators_reset_command_exits_1_when_refused_and_0_when_done(rig):
    rack, _ = rig
    argv = reset_argv(rack.gpu_reset_command, {"node": NODE, "gpu": "1", "uuid": "-"})
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "gpu-reset refused" in refused.stderr and "in use" in refused.stderr
    rack.inject("workload", node=NODE, gpu=1, ratio=0.0)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{NODE} gpu 1 reset" in json.loads(done.stdout)["result"]


def ladder_engine(tmp_path: Path, rack: SimRack, twin: NvmlTwin):
    """A small engine of this node (node01 of two, 2 GPUs read through the twin), drains on the simulated
    scheduler, gpu_reset automatic (its default), the simulator's reset command as the demo's configs carry."""
    from agent.remediation.engine import Executors, RemediationEngine
    from agent.remediation.settings import RemediationSettings
    from sim.scheduler import SimulatedScheduler
    from tests.remediation_support import identity, inventory

    s = RemediationSettings.model_validate({
        "guardrails": {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "max_drained_fraction": 1.0},
        "gpu_recovery": {"gpu_reset_command": rack.gpu_reset_command, "verify_seconds": 1.5}})
    sched = SimulatedScheduler([NODE, "node02"])
    ex = Executors(scheduler=sched, gpu_libs={NODE: twin})
    return RemediationEngine(s, "enforce", identity(), inventory(gpus=2), tmp_path / "journal.db", ex), sched


@pytest.mark.parametrize("reboot_class", [False, True])
def test_the_gpu_reset_playbook_resets_the_incidents_gpu_and_records_the_outcome(rig, tmp_path, reboot_class):
    rack, twin = rig
    for gpu in (0, 1):
        rack.inject("xid", node=NODE, gpu=gpu, code=48, sticky=True)
    rack.inject("workload", node=NODE, ratio=0.0)  # the node drained, its job gone: both GPUs idle
    if reboot_class:
        rack.inject("recovery-action", node=NODE, gpu=1, action=2)

    async def main() -> tuple[list, list]:
        eng, sched = ladder_engine(tmp_path, rack, twin)
        await eng.start()
        try:
            assert "gpu_reset" in eng.actions
            inc = eng.fire("gpu_reset_required", {"node": NODE, "gpu": "1"}, "critical")
            await await_for(lambda: inc.state not in ("open", "mitigating"), timeout=60, what="the playbook's end")
            done = [e for e in eng.journal.entries() if e.kind == "result" and e.action == "gpu_reset"]
            assert sched.nodes[NODE].state == "drained"  # the reset ran after the drain
            # the recovery and its outcome, counted per action (what the dashboards and alerts read)
            reg = CollectorRegistry()
            reg.register(eng.collector())
            counted = {r: reg.get_sample_value("supernode_remediation_actions_total",
                                               {"playbook": "gpu-reset", "action": "gpu_reset", "result": r})
                       for r in ("done", "failed")}
            assert counted == ({"done": 0.0, "failed": 1.0} if reboot_class else {"done": 1.0, "failed": 0.0})
            return done, eng.recoveries.since(NODE, "1", 0.0)
        finally:
            await eng.stop()

    done, ledger = asyncio.run(main())
    assert [e.target for e in done] == [f"gpu=1,node={NODE}"]  # the incident's GPU, and only it
    assert [f["code"] for f in gpu_state(rack, 0)["xid_faults"]] == [48]
    assert resets_run(rack) == [{"node": NODE, "gpu": 1}]
    assert [(r.action, r.gpu, r.ok) for r in ledger] == [("gpu_reset", "1", not reboot_class)]
    if reboot_class:  # what the judge escalates to a reboot on
        assert done[0].result == "failed" and ledger[0].why.startswith("reset did not clear the fault")
    else:
        assert done[0].result == "done" and done[0].detail["after"]["processes_waited_for"] == []
