"""Drain against a real single-host Slurm (munged + slurmctld + slurmd started here, stopped by PID)."""

from __future__ import annotations

import asyncio

import pytest

from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors

from helpers import await_for, require_binary
from remediation_support import engine, inventory, results
from slurm import SlurmCluster


@pytest.fixture(scope="module")
def cluster():
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
        require_binary(b)
    c = SlurmCluster(names=["node01", "node02", "node03"]).start()
    yield c
    c.cleanup()


def test_drain_resume_ownership_and_blast_radius_with_real_slurm(cluster, tmp_path):
    async def main():
        sched = SlurmScheduler(slurm_conf=cluster.conf)
        inv = inventory(nodes=("node01", "node02", "node03"))
        eng = engine(tmp_path, executors=Executors(scheduler=sched), inv=inv, max_drained_nodes=2,
                     max_drained_fraction=1.0)
        await eng.start()
        # a person drains node02: it counts for blast radius and is never resumed by us
        assert cluster.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=bob: fan swap").returncode == 0
        a = eng.fire("gpu_xid_critical", {"node": "node01"}, "critical")
        await await_for(lambda: a.state == "mitigated", timeout=20)
        st = await sched.state("node01")
        assert st.drained and st.reason.startswith("supernode-agent: " + a.id)
        b = eng.fire("gpu_xid_critical", {"node": "node03"}, "critical", source="alertmanager")
        await await_for(lambda: b.state == "mitigated", timeout=20)
        assert cluster.states()["node03"] == "idle"  # 2 already drained per sinfo: blocked
        assert [e.detail["guardrail"] for e in results(eng, kind="blocked", action="drain")] == ["blast_radius"]
        # someone else's drain: our incident on node02 neither drains nor resumes it
        c = eng.fire("gpu_lost", {"node": "node02", "gpu": "0"}, "critical", source="alertmanager")
        await await_for(lambda: c.state == "mitigated", timeout=20)
        eng.clear("gpu_lost", {"node": "node02", "gpu": "0"})
        eng.clear("gpu_xid_critical", {"node": "node01"})
        await await_for(lambda: cluster.states().get("node01") == "idle", timeout=20, what="node01 resumed")
        await await_for(lambda: not eng.tasks, timeout=20)
        assert cluster.states()["node02"] == "drained"
        assert (await sched.state("node02")).reason == "bob: fan swap"
        await eng.stop()
    asyncio.run(main())
    cluster.scontrol("update", "NodeName=node02", "State=RESUME")
