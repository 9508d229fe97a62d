"""Jobs interrupted, recorded by a real drain against a real Slurm, in the report and in the agent's own series."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry

from agent.goodput import JournalRead, goodput_report
from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.settings import RemediationSettings

from tests.helpers import await_for, wait_for
from tests.remediation_support import identity, inventory
from tests.slurm import batch_job, running_cluster

OUTCOMES = ("mitigated", "partial", "failed", "observed")


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"], "sbatch", "squeue", "scancel")


def _engine(tmp_path, cluster, **slurm) -> RemediationEngine:
    settings = RemediationSettings.model_validate({
        "slurm": {"checkpoint_signal": "USR1"},
        # resume without the GPU health check (no NVML here; the check is tested in test_judgement.py)
        "guardrails": {"cooldown_seconds": 0, "max_drained_fraction": 1.0, "max_drained_nodes": 2,
                       "automatic": ["resume_after_check"]}})
    sched = SlurmScheduler(slurm_conf=cluster.conf, **slurm)
    return RemediationEngine(settings, "enforce", identity("enforce"), inventory(nodes=("node01", "node02")),
                             tmp_path / "journal.db", Executors(scheduler=sched))


def _running(cluster, job: str) -> bool:
    q = subprocess.run(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%i"], env=cluster.env,
                       capture_output=True, text=True, timeout=20)
    return job in q.stdout.split()


def _drain_and_resume(eng: RemediationEngine, cluster, seen: dict) -> None:
    """gpu_lost on node01: drained (the series say out of service), then cleared and resumed (in service)."""
    async def main() -> None:
        await eng.start()
        reg = CollectorRegistry()
        reg.register(eng.collector())
        seen["before"] = reg.get_sample_value("supernode_node_in_service")
        inc = eng.fire("gpu_lost", {"node": "node01"}, "critical")
        await await_for(lambda: inc.state in OUTCOMES, timeout=30, what="outcome")
        seen["state"] = inc.state
        seen["during"] = reg.get_sample_value("supernode_node_in_service")
        await await_for(lambda: reg.get_sample_value("supernode_node_out_of_service_seconds_total",
                                                     {"cause": "gpu_other"}) > 0, timeout=30,
                        what="out-of-service seconds counted to gpu_other")
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: cluster.states().get("node01", "").rstrip("*") in ("idle", "mixed", "allocated"),
                        timeout=30, what="node01 resumed")
        await await_for(lambda: reg.get_sample_value("supernode_node_in_service") == 1, timeout=30,
                        what="in service again after the undo")
        seen["after"] = reg.get_sample_value("supernode_node_out_of_service_seconds_total", {"cause": "gpu_other"})
        seen["other_causes"] = sum(reg.get_sample_value("supernode_node_out_of_service_seconds_total", {"cause": c})
                                   for c in ("leak", "maintenance", "gpu_reboot"))
        await eng.stop()
    asyncio.run(main())


def test_a_real_drain_records_the_running_job_and_the_report_counts_it(cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrap 'echo checkpointed' USR1\nfor i in $(seq 600); do sleep 0.1; done\n")
    since = time.time()
    with batch_job(cluster, script) as job:
        wait_for(lambda: _running(cluster, job), 30, what=f"job {job} running on node01")
        eng = _engine(tmp_path, cluster)
        seen: dict = {}
        _drain_and_resume(eng, cluster, seen)
    assert seen["state"] == "mitigated"
    assert (seen["before"], seen["during"]) == (1, 0)
    assert seen["after"] > 0 and seen["other_causes"] == 0
    j = eng.journal
    reopened = type(j)(j.path, readonly=True)
    entries = reopened.entries()
    reopened.close()
    intent = next(e for e in entries if e.kind == "intent" and e.action == "drain" and e.detail["phase"] == "apply")
    assert intent.detail["plan"]["jobs"] == [job]  # on disk before the drain, as Slurm listed it at that moment
    g = goodput_report([JournalRead(entries, "node01")], 4, since, time.time())
    assert [(i["detector"], i["cause"], i["jobs"], i["jobs_interrupted"]) for i in g["incidents"]] == \
        [("gpu_lost", "gpu_other", [job], 1)]
    node = g["nodes"]["node01"]
    assert node["out_of_service_seconds"] > 0 and node["by_state"]["drained"] == node["out_of_service_seconds"]
    assert node["gpu_hours_lost"] == pytest.approx(node["out_of_service_seconds"] * 4 / 3600)


def test_a_scheduler_that_cannot_list_jobs_records_unknown_and_still_drains(cluster, tmp_path):
    """squeue fails: the drain goes on (a safety step never waits on bookkeeping), the plan says why the jobs are
    unknown, and the report shows them unknown, not 0."""
    eng = _engine(tmp_path, cluster, squeue="/bin/false")
    seen: dict = {}
    _drain_and_resume(eng, cluster, seen)
    assert seen["state"] == "mitigated"
    entries = eng.journal.entries()
    intent = next(e for e in entries if e.kind == "intent" and e.action == "drain" and e.detail["phase"] == "apply")
    assert "jobs" not in intent.detail["plan"] and "exit 1" in intent.detail["plan"]["jobs_error"]
    g = goodput_report([JournalRead(entries, "node01")], 4, 0.0, time.time())
    assert [i["jobs_interrupted"] for i in g["incidents"]] == [None]
