"""The GPU recovery ladder's Slurm steps against a real single-host Slurm and the simulator's NVML twin.

One cluster for the module (munged + slurmctld + two supervised slurmds, sim/slurmd_supervisor.py) whose
RebootProgram tells the simulator (in this process, on its own loop) that the node rebooted, then restarts
the node's slurmd in a fresh time namespace: Slurm sees a new BootTime, as after a real reboot. The GPUs
are verified with the agent's own health read (gpu_health.check_gpus) through the twin over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.remediation.actions import ActionError
from agent.remediation.actions.job_notify import JobNotifyAction
from agent.remediation.actions.node_reboot import NodeRebootAction
from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.settings import RemediationSettings
from agent.remediation.gpu_health import check_gpus
from sim.nvml_twin import NvmlTwin
from agent.remediation.actions.slurm import SchedulerError
from sim.ports import free_port
from sim.scheduler import SimulatedScheduler
from sim.server import Simulator
from sim.slurm_cluster import simulator_reboot_command
from tests.helpers import await_for, require_binary, wait_for
from tests.remediation_support import identity, inventory, results
from tests.sim_thread import SimThread
from tests.slurm import SlurmCluster, batch_job, node_states

NODES = ["node01", "node02"]
GPUS = 2
CTX = {"incident_id": "inc-7", "detector": "gpu_reboot_required"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[SimThread]:
    s = SimThread(Simulator(nodes=len(NODES), gpus=GPUS, devices=False, advertise=False,
                            workdir=tmp_path_factory.mktemp("sim")))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cluster(sim: SimThread) -> Iterator[SlurmCluster]:
    """The module's Slurm; a node that a test rebooted is back and idle before the next test starts."""
    for c in _cluster(sim):
        if not c.can_reboot:
            pytest.skip("time namespaces unavailable here (need root, Linux >= 5.6): the test Slurm cannot reboot")
        yield c


def _cluster(sim: SimThread) -> Iterator[SlurmCluster]:
    c = SlurmCluster(names=NODES, on_reboot=simulator_reboot_command(sim.sim.url))
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch", "scancel"):
        require_binary(b)
    c.start(timeout=60)
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def sched(cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    yield SlurmScheduler(slurm_conf=cluster.conf)
    wait_for(lambda: all(s == "idle" for s in node_states(cluster).values()), 90, interval=0.5,
             what=f"every node idle again: {node_states(cluster)}")


def boots(sim: SimThread, node: str) -> int:
    return sim.sim.state()["nodes"][node]["boots"]


def verify_with_twin(sim: SimThread):
    """The agent's GPU health read, through the simulator's NVML twin over HTTP (what the engine passes)."""
    async def verify(node: str) -> tuple[bool, str]:
        twin = NvmlTwin(sim.sim.url, node, cache_ttl=0.0)
        twin.nvmlInit()
        try:
            return await asyncio.to_thread(check_gpus, twin, GPUS)
        finally:
            twin.nvmlShutdown()
    return verify


def reboot_action(sched: SlurmScheduler, sim: SimThread, timeout: float = 90.0) -> NodeRebootAction:
    return NodeRebootAction(sched, verify_with_twin(sim), timeout_seconds=timeout, verify_seconds=3.0,
                            poll_seconds=0.3)


def slurm_boot_time(cluster: SlurmCluster, node: str) -> str:
    out = cluster.scontrol("show", "node", "-o", node).stdout
    return next(f for f in out.split() if f.startswith("BootTime="))


def test_scheduler_reboot_goes_through_the_reboot_program_and_the_node_comes_back_idle(cluster, sim, sched):
    async def main() -> float | None:
        before = await sched.boot_time("node01")
        await sched.reboot("node01", "supernode-agent: test reboot")
        return before
    boots_before = boots(sim, "node01")
    shown_before = slurm_boot_time(cluster, "node01")
    before = asyncio.run(main())
    assert before is not None
    wait_for(lambda: asyncio.run(sched.boot_time("node01")) > before and node_states(cluster)["node01"] == "idle",
             90, interval=0.5, what="node01 back from its reboot with a later BootTime, idle")
    assert slurm_boot_time(cluster, "node01") != shown_before
    assert boots(sim, "node01") == boots_before + 1  # the RebootProgram's on-reboot command told the twin
    assert node_states(cluster)["node02"] == "idle"  # only the node asked for


def test_node_reboot_clears_a_reboot_class_fault_and_proves_it(cluster, sim, sched):
    """XID 79 (off the bus, RESTART_BM): the health read fails before; the reboot through Slurm clears it in
    the twin; the action returns ok with the later boot time and the read that passed."""
    sim.post("/api/v1/inject", {"kind": "xid", "params": {"node": "node01", "gpu": 1, "code": 79, "sticky": True}})
    act = reboot_action(sched, sim)

    async def main() -> tuple[dict, Any]:
        assert not (await act.verify("node01"))[0]
        plan = await act.plan({"node": "node01"}, {}, CTX)
        assert await act.reconcile({"node": "node01"}, {}, plan) == "not_applied"
        res = await act.apply({"node": "node01"}, {}, CTX, plan)
        return plan, res

    plan, res = asyncio.run(main())
    assert res.ok and not res.skipped
    assert res.after["boot_time"] > res.after["boot_time_before"] == plan["before"]["boot_time"]
    assert res.after["state"] == "idle" and res.after["verify"]
    assert asyncio.run(act.reconcile({"node": "node01"}, {}, plan)) == "applied"  # booted since that plan
    assert asyncio.run(act.undo({"node": "node01"}, res.before, res.after, {})).skipped


def test_node_reboot_fails_when_the_gpus_are_not_healthy_after_the_boot(cluster, sim, sched):
    """A failed HBM row remap survives a reboot: the node comes back, the verify fails, the step fails."""
    sim.post("/api/v1/inject", {"kind": "row-remap", "params": {"node": "node02", "gpu": 0, "state": "failed"}})
    act = reboot_action(sched, sim)
    boots_before = boots(sim, "node02")

    async def main() -> None:
        plan = await act.plan({"node": "node02"}, {}, CTX)
        with pytest.raises(ActionError) as err:
            await act.apply({"node": "node02"}, {}, CTX, plan)
        assert "not healthy" in str(err.value) and not err.value.permanent
        with pytest.raises(ActionError, match="not healthy"):  # the runner's retry: verified again, not rebooted
            await act.apply({"node": "node02"}, {}, CTX, plan)
    try:
        asyncio.run(main())
        assert boots(sim, "node02") == boots_before + 1  # one reboot: the failure is the health read's
    finally:
        sim.post("/api/v1/clear")


def test_node_reboot_times_out_when_the_node_never_comes_back(cluster, sim, sched):
    """The on-reboot command fails, so the RebootProgram never restarts slurmd: no new BootTime, and the
    action fails within its timeout saying so (the ladder escalates to service)."""
    config = cluster.dir / "reboot.json"
    good = config.read_text()
    config.write_text(json.dumps({"on_reboot": ["false"]}))
    act = reboot_action(sched, sim, timeout=8.0)

    async def main() -> dict:
        plan = await act.plan({"node": "node02"}, {}, CTX)
        with pytest.raises(ActionError) as err:
            await act.apply({"node": "node02"}, {}, CTX, plan)
        assert "not back from its reboot within 8 s" in str(err.value)
        return plan
    try:
        plan = asyncio.run(main())
        # after a crash: a reboot still pending in Slurm counts as applied (it will happen)
        assert asyncio.run(act.reconcile({"node": "node02"}, {}, plan)) == "applied"
    finally:
        config.write_text(good)
        _restart_slurmd(cluster, "node02")  # the boot that never came, so the next test finds node02 idle


def _restart_slurmd(cluster: SlurmCluster, node: str) -> None:
    """Ask node's supervisor for the restart its RebootProgram did not ask for."""
    sup = next(p for p in cluster.procs if node in p.args and "run" in p.args)
    os.kill(sup.pid, signal.SIGUSR1)


def test_job_notify_comments_the_running_job_then_requeues_it(cluster, sched, tmp_path: Path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 300\n")
    ctx = {"incident_id": "inc-13", "detector": "gpu_app_fault", "node": "node01", "gpu": "1", "xid": 13,
           "mnemonic": "GR_EXCEPTION", "immediate_action": "RESTART_APP"}
    act = JobNotifyAction(sched, "comment")
    with batch_job(cluster, script) as job:
        wait_for(lambda: asyncio.run(sched.jobs("node01")) == [job], 30, interval=0.3, what=f"job {job} running")

        async def comment() -> tuple[dict, Any]:
            plan = await act.plan({"node": "node01"}, {}, ctx)
            assert await act.reconcile({"node": "node01"}, {}, plan) == "not_applied"
            return plan, await act.apply({"node": "node01"}, {}, ctx, plan)
        plan, res = asyncio.run(comment())
        assert res.ok and res.after["told"] == [job]
        shown = cluster.scontrol("show", "job", "-o", job).stdout
        text = plan["text"]
        assert f"Comment={text}" in shown
        assert text.startswith("supernode-agent: inc-13") and all(w in text for w in ("node01", "gpu 1", "XID 13",
                                                                                      "RESTART_APP"))
        assert asyncio.run(act.reconcile({"node": "node01"}, {}, plan)) == "applied"

        async def requeue() -> Any:
            plan = await act.plan({"node": "node01"}, {"how": "requeue"}, ctx)
            return await act.apply({"node": "node01"}, {"how": "requeue"}, ctx, plan)
        res = asyncio.run(requeue())
        assert res.after["done"] == "requeue" and res.after["told"] == [job]
        shown = cluster.scontrol("show", "job", "-o", job).stdout
        assert "Restarts=1" in shown, shown


def test_job_notify_on_a_node_without_jobs_is_skipped(cluster, sched):
    act = JobNotifyAction(sched, "comment")

    async def main() -> Any:
        plan = await act.plan({"node": "node02"}, {}, {"incident_id": "inc-1"})
        return plan, await act.apply({"node": "node02"}, {}, {"incident_id": "inc-1"}, plan)
    plan, res = asyncio.run(main())
    assert res.ok and res.skipped and "no running job" in res.message
    assert asyncio.run(act.reconcile({"node": "node02"}, {}, plan)) == "applied"


def test_an_unreachable_slurmctld_is_a_retried_block_not_a_reboot(cluster, tmp_path: Path):
    """A slurm.conf naming a port nobody serves: the plan raises the scheduler_unreachable guardrail (the engine
    retries it with backoff) and nothing is rebooted."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
                              for line in cluster.conf.read_text().splitlines()) + "\n")
    act = NodeRebootAction(SlurmScheduler(slurm_conf=conf, timeout=30), lambda node: _never(), 10, 1)
    with pytest.raises(ActionError) as err:
        asyncio.run(act.plan({"node": "node01"}, {}, CTX))
    assert err.value.guardrail == "scheduler_unreachable"
    assert node_states(cluster)["node01"] == "idle"


async def _never() -> tuple[bool, str]:
    raise AssertionError("verify must not run")


def test_cluster_stop_ends_every_supervisor_and_slurmd(sim, tmp_path: Path):
    """stop() ends what we started, the supervised slurmds included (their pids from the pid files)."""
    for c in _cluster(sim):
        assert c.can_reboot
        pids = [int((c.dir / f"slurmd-{n}.pid").read_text()) for n in NODES]
        sups = [p for p in c.procs if "run" in p.args]
        assert len(sups) == len(NODES) and all(_alive(p) for p in pids)
        c.stop()
        assert not any(_alive(p) for p in pids) and all(s.poll() is not None for s in sups)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"



def test_the_simulated_scheduler_reboots_through_the_simulator_or_says_why_not(sim):
    """The demo without slurmctld: a reboot tells the running simulator (its twin's node gets a new boot),
    then the node is idle with a later boot time; with no simulator to tell, a SchedulerError, never a
    pretended reboot. Its job table is empty unless something adds a job."""
    ticks = iter([100.0, 200.0, 300.0])
    sched = SimulatedScheduler(NODES, simulator_url=lambda: sim.sim.url, clock=lambda: next(ticks))
    boots_before = boots(sim, "node01")

    async def main() -> None:
        assert await sched.jobs("node01") == []
        await sched.drain("node01", "supernode-agent: inc-1")
        assert await sched.boot_time("node01") == 100.0
        await sched.reboot("node01", "supernode-agent: inc-1")
        assert (await sched.state("node01")).state == "idle" and await sched.boot_time("node01") == 300.0
        sched.add_job("7", "node01")
        await sched.comment_job("7", "supernode-agent: told")
        assert await sched.job_comment("7") == "supernode-agent: told"
        await sched.requeue_job("7")
        assert await sched.jobs("node01") == [] and sched.requeued == ["7"]

        def nowhere() -> str:
            raise LookupError("no running simulator found")
        for url, why in ((nowhere, "no running simulator"), (lambda: f"http://127.0.0.1:{free_port()}", "does not answer")):
            lost = SimulatedScheduler(NODES, simulator_url=url)
            await lost.drain("node02", "supernode-agent: inc-2")
            with pytest.raises(SchedulerError, match=why):
                await lost.reboot("node02", "supernode-agent: inc-2")
            assert (await lost.state("node02")).drained  # nothing pretended
    asyncio.run(main())
    assert boots(sim, "node01") == boots_before + 1


def test_the_engine_reboots_through_slurm_and_tells_jobs_with_its_registered_actions(cluster, sim, sched, tmp_path):
    """The ladder's playbooks as the engine runs them: gpu-reboot's node_reboot (approval waived here) reboots
    node01 through Slurm and verifies with the engine's own health read (ResumeCheck over node01's twin);
    gpu-app-fault's job_notify finds no job on node01 and says so; the node is not drained."""
    twin = NvmlTwin(sim.sim.url, "node01", cache_ttl=0.0)
    twin.nvmlInit()
    settings = RemediationSettings.model_validate({
        "guardrails": {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "automatic": ["node_reboot"]},
        "gpu_recovery": {"reboot_timeout_seconds": 90, "verify_seconds": 5}})
    eng = RemediationEngine(settings, "enforce", identity("enforce"), inventory(nodes=NODES, gpus=GPUS),
                            tmp_path / "journal.db", Executors(scheduler=sched, gpu_libs={"node01": twin}))
    sim.post("/api/v1/inject", {"kind": "xid", "params": {"node": "node01", "gpu": 0, "code": 79, "sticky": True}})

    async def main() -> None:
        await eng.start()
        inc = eng.fire("gpu_reboot_required", {"node": "node01"}, "critical", detail={"xid": 79})
        await await_for(lambda: inc.state in ("mitigated", "failed"), timeout=120, what="the reboot step ended")
        (done,) = [e for e in results(eng, kind="result", action="node_reboot")]
        assert done.result == "done", done.detail
        assert done.detail["after"]["boot_time"] > done.detail["after"]["boot_time_before"]
        app = eng.fire("gpu_app_fault", {"node": "node01", "gpu": "0"}, "warning", detail={"xid": 13})
        await await_for(lambda: results(eng, kind="result", action="job_notify"), timeout=30, what="job_notify ran")
        (told,) = results(eng, kind="result", action="job_notify")
        assert told.result == "done" and told.detail["skipped"] and "no running job" in told.detail["message"]
        assert app is not None and (await sched.state("node01")).state == "idle"
        # each recovery and its outcome counted per action
        reg = CollectorRegistry()
        reg.register(eng.collector())
        for book, action in (("gpu-reboot", "node_reboot"), ("gpu-app-fault", "job_notify")):
            assert reg.get_sample_value("supernode_remediation_actions_total",
                                        {"playbook": book, "action": action, "result": "done"}) == 1.0, action
            assert reg.get_sample_value("supernode_remediation_actions_total",
                                        {"playbook": book, "action": action, "result": "failed"}) == 0.0, action
        await eng.stop()
    try:
        asyncio.run(main())
    finally:
        twin.nvmlShutdown()
    # The goodput report over this journal: the reboot is node01's one outage, rebooting, to gpu_reboot, from
    # its intent to its result; node01 ran no job, so none was interrupted (recorded as such, not unknown).
    from agent.goodput import JournalRead, goodput_report

    entries = eng.journal.entries()
    (intent,) = [e for e in entries if e.kind == "intent" and e.action == "node_reboot"]
    (result,) = [e for e in entries if e.kind == "result" and e.action == "node_reboot"]
    g = goodput_report([JournalRead(entries, "node01")], GPUS, intent.ts - 60, result.ts + 60)
    node = g["nodes"]["node01"]
    assert node["by_state"]["rebooting"] == pytest.approx(result.ts - intent.ts)
    assert node["by_cause"]["gpu_reboot"]["out_of_service_seconds"] == node["out_of_service_seconds"]
    assert [(i["cause"], i["jobs_interrupted"]) for i in g["incidents"] if i["detector"] == "gpu_reboot_required"] \
        == [("gpu_reboot", 0)]


def test_node_reboot_gives_the_jobs_their_checkpoint_signal_and_slurm_reboots_once_they_end(cluster, sim, sched,
                                                                                         tmp_path: Path):
    """`reboot ASAP` waits for the node's jobs: they get the checkpoint signal first (as before a drain), this
    job checkpoints and exits on it, and the reboot goes through."""
    got = tmp_path / "checkpointed"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ntrap 'echo checkpointed > {got}; exit 0' USR1\n"
                      "for i in $(seq 3000); do sleep 0.1; done\n")
    act = NodeRebootAction(sched, verify_with_twin(sim), timeout_seconds=90.0, verify_seconds=3.0, poll_seconds=0.3,
                           checkpoint_signal="USR1")
    with batch_job(cluster, script) as job:
        wait_for(lambda: asyncio.run(sched.jobs("node01")) == [job], 30, interval=0.3, what=f"job {job} running")

        async def main() -> Any:
            plan = await act.plan({"node": "node01"}, {}, CTX)
            return plan, await act.apply({"node": "node01"}, {}, CTX, plan)
        plan, res = asyncio.run(main())
    assert plan["jobs"] == [job]  # the jobs the reboot interrupts, in the plan (the intent) before the reboot
    assert got.read_text().strip() == "checkpointed"
    assert res.ok and res.after["checkpoint_signal"] == "USR1"
    assert res.after["boot_time"] > res.after["boot_time_before"]
