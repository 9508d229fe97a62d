"""Drain against a real single-host Slurm (munged + slurmctld + slurmd started here, stopped by PID)."""

from __future__ import annotations

import asyncio

import pytest

from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors

from tests.helpers import await_for, require_binary
from agent.remediation.engine import RemediationEngine
from agent.remediation.settings import RemediationSettings
from tests.remediation_support import engine, identity, inventory, results
from tests.slurm import SlurmCluster, batch_job, node_states


@pytest.fixture(scope="module")
def cluster():
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
        require_binary(b)
    c = SlurmCluster(names=["node01", "node02", "node03"]).start()
    yield c
    c.cleanup()


async def _engine_after_bobs_drain(cluster, tmp_path) -> tuple[SlurmScheduler, RemediationEngine]:
    """A started engine on the three-node cluster (max_drained_nodes 2) after a person drained node02."""
    sched = SlurmScheduler(slurm_conf=cluster.conf)
    eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inventory(nodes=("node01", "node02", "node03")),
                 max_drained_nodes=2, max_drained_fraction=1.0)
    await eng.start()
    assert cluster.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=bob: fan swap").returncode == 0
    return sched, eng


def test_drain_resume_ownership_and_blast_radius_with_real_slurm(cluster, tmp_path):
    async def main():
        sched, eng = await _engine_after_bobs_drain(cluster, tmp_path)  # counts for blast radius, never resumed
        a = eng.fire("gpu_lost", {"node": "node01"}, "critical")
        await await_for(lambda: a.state == "mitigated", timeout=20)
        st = await sched.state("node01")
        assert st.drained and st.reason.startswith("supernode-agent: " + a.id)
        b = eng.fire("gpu_lost", {"node": "node03"}, "critical", source="alertmanager")
        await await_for(lambda: b.state == "failed", timeout=20)
        assert node_states(cluster)["node03"] == "idle"  # 2 already drained per sinfo: blocked
        assert [e.detail["guardrail"] for e in results(eng, kind="blocked", action="drain")] == ["blast_radius"]
        # someone else's drain: our incident on node02 neither drains nor resumes it
        c = eng.fire("gpu_lost", {"node": "node02", "gpu": "0"}, "critical", source="alertmanager")
        await await_for(lambda: c.state == "mitigated", timeout=20)
        eng.clear("gpu_lost", {"node": "node02", "gpu": "0"})
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: node_states(cluster).get("node01") == "idle", timeout=20, what="node01 resumed")
        await await_for(lambda: not eng.tasks, timeout=20)
        assert node_states(cluster)["node02"] == "drained"
        assert (await sched.state("node02")).reason == "bob: fan swap"
        await eng.stop()
    asyncio.run(main())
    cluster.scontrol("update", "NodeName=node02", "State=RESUME")


def test_two_drains_checked_at_once_pass_the_blast_radius_one_at_a_time(cluster, tmp_path):
    """Two incidents on two nodes fire in the same instant. Each drain asks `sinfo` (a subprocess: the loop
    runs the other step meanwhile), so both see one node drained; the first to pass holds its place and the
    second counts it: max_drained_nodes=2 holds, with one drain blocked by blast_radius."""
    async def main():
        sched, eng = await _engine_after_bobs_drain(cluster, tmp_path)
        a = eng.fire("gpu_lost", {"node": "node01"}, "critical", source="alertmanager")
        b = eng.fire("gpu_lost", {"node": "node03"}, "critical", source="alertmanager")
        await await_for(lambda: {a.state, b.state} <= {"mitigated", "failed"}, timeout=30, what="both steps ended")
        assert {a.state, b.state} == {"mitigated", "failed"}, node_states(cluster)
        states = node_states(cluster)
        assert sorted(n for n in ("node01", "node03") if states[n] in ("drained", "draining")) == \
            [("node01" if a.state == "mitigated" else "node03")]
        assert [e.detail["guardrail"] for e in results(eng, kind="blocked", action="drain")] == ["blast_radius"]
        eng.clear("gpu_lost", {"node": "node01"})
        eng.clear("gpu_lost", {"node": "node03"})
        await await_for(lambda: all(node_states(cluster).get(n) == "idle" for n in ("node01", "node03")), timeout=20,
                        what="our drain resumed")
        await eng.stop()
    try:
        asyncio.run(main())
    finally:
        cluster.scontrol("update", "NodeName=node02", "State=RESUME")


def test_checkpoint_signal_reaches_the_running_job_before_the_drain(cluster, tmp_path):
    """`checkpoint_signal`: the node's batch jobs get the signal (a chance to checkpoint), then the node drains.
    The order is Slurm's own: slurmctld logs each request as it serves it, the job's signal (REQUEST_KILL_JOB)
    before node01's `state set to DRAINING`; and the job itself trapped the signal."""

    from tests.helpers import wait_for

    for b in ("sbatch", "squeue", "scancel"):
        require_binary(b)
    marker, ready = tmp_path / "got-usr1", tmp_path / "ready"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
trap 'echo checkpointed > {marker}' USR1
touch {ready}
for i in $(seq 600); do sleep 0.1; done
""")
    ctld_log = cluster.dir / "log" / "slurmctld.log"
    served_before = 0
    with batch_job(cluster, script) as job:
        wait_for(lambda: ready.exists(), 30, what="job running on node01")

        async def main():
            nonlocal served_before
            sched = SlurmScheduler(slurm_conf=cluster.conf)
            inv = inventory(nodes=("node01", "node02", "node03"))
            settings = RemediationSettings.model_validate({
                "slurm": {"checkpoint_signal": "USR1"},
                "guardrails": {"cooldown_seconds": 0, "max_drained_fraction": 1.0, "max_drained_nodes": 3,
                               "automatic": ["resume_after_check"]}})
            eng = RemediationEngine(settings, "enforce", identity("enforce"), inv, tmp_path / "journal.db",
                                    Executors(scheduler=sched))
            await eng.start()
            assert not marker.exists()  # ordering, not clocks: the job is signalled only once the drain begins
            served_before = ctld_log.stat().st_size
            inc = eng.fire("gpu_lost", {"node": "node01"}, "critical")
            await await_for(lambda: inc.state == "mitigated", timeout=20)
            st = await sched.state("node01")
            assert st.reason.startswith("supernode-agent: ") and st.state in ("draining", "drained")
            eng.clear("gpu_lost", {"node": "node01"})
            await await_for(lambda: node_states(cluster).get("node01") in ("idle", "mixed", "allocated"), timeout=20,
                            what="node01 resumed")
            await eng.stop()

        asyncio.run(main())
        wait_for(lambda: marker.exists(), 10, what="the job trapped USR1")
        served = ctld_log.read_bytes()[served_before:].decode(errors="replace").splitlines()
        signal_at = [i for i, line in enumerate(served) if f"REQUEST_KILL_JOB JobId={job} " in line]
        drain_at = [i for i, line in enumerate(served) if "node node01 state set to DRAINING" in line]
        assert signal_at and drain_at and signal_at[0] < drain_at[0], served
