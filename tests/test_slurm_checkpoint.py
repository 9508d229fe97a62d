"""The checkpoint signal reaches a real job's `srun` step as well as its batch shell, and never blocks the drain."""

from __future__ import annotations

import asyncio

import pytest

from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.settings import RemediationSettings

from tests.helpers import await_for, wait_for
from tests.remediation_support import identity, inventory, results
from tests.slurm import batch_job, running_cluster

OUTCOMES = ("mitigated", "partial", "failed", "observed")


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"], "sbatch", "srun", "squeue", "scancel")


def xid_engine(tmp_path, cluster, **slurm) -> tuple[RemediationEngine, SlurmScheduler]:
    settings = RemediationSettings.model_validate({
        "slurm": {"checkpoint_signal": "USR1", **slurm},
        # resume without the GPU health check (no NVML here; the check is tested in test_judgement.py)
        "guardrails": {"cooldown_seconds": 0, "max_drained_fraction": 1.0, "max_drained_nodes": 2,
                       "automatic": ["resume_after_check"]}})
    sched = SlurmScheduler(slurm_conf=cluster.conf, **{k: v for k, v in slurm.items() if k in ("squeue", "scancel")})
    eng = RemediationEngine(settings, "enforce", identity("enforce"), inventory(nodes=("node01", "node02")),
                            tmp_path / "journal.db", Executors(scheduler=sched))
    return eng, sched


def drain_and_resume(eng: RemediationEngine, cluster) -> str:
    async def main() -> str:
        await eng.start()
        inc = eng.fire("gpu_lost", {"node": "node01"}, "critical")
        await await_for(lambda: inc.state in OUTCOMES, timeout=30, what="outcome")
        state = inc.state
        assert cluster.states()["node01"] in ("draining", "drained")
        eng.clear("gpu_lost", {"node": "node01"})
        await await_for(lambda: cluster.states().get("node01") in ("idle", "mixed", "allocated"), timeout=30,
                        what="node01 resumed")
        await eng.stop()
        return state
    return asyncio.run(main())


def test_checkpoint_signal_reaches_the_batch_shell_and_its_srun_step(cluster, tmp_path):
    batch, step, ready = tmp_path / "batch-got-usr1", tmp_path / "step-got-usr1", tmp_path / "step-ready"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
trap 'echo checkpointed > {batch}' USR1
srun --overlap -n1 bash -c "trap 'echo checkpointed > {step}' USR1; touch {ready}; \\
  for i in \\$(seq 600); do sleep 0.1; done" &
for i in $(seq 600); do sleep 0.1; done
""")
    with batch_job(cluster, script):
        wait_for(lambda: ready.exists(), 30, what="the srun step running on node01")
        eng, _ = xid_engine(tmp_path, cluster)
        assert drain_and_resume(eng, cluster) == "mitigated"
        wait_for(lambda: step.exists() and batch.exists(), 15, what="both the step and the batch shell trapped USR1")
        drain = results(eng, kind="result", action="drain")
        assert drain[0].detail["after"]["checkpoint_signal"] == "USR1"


def test_a_failed_checkpoint_signal_is_recorded_and_never_blocks_the_drain(cluster, tmp_path):
    eng, _ = xid_engine(tmp_path, cluster, squeue="/bin/false")  # programs come from the config
    assert drain_and_resume(eng, cluster) == "mitigated"
    drain = results(eng, kind="result", action="drain")[0]
    assert drain.result == "done" and "exit 1" in drain.detail["after"]["checkpoint_error"]
