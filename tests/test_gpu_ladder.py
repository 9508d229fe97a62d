"""Issue 33 end to end: GPU faults judged by NVIDIA's catalogue and recovered by the ladder, with the real daemon,
a real slurmctld (its RebootProgram rebooting the simulated node for real: slurmd comes back with a new boot
time) and the NVML twin.

One agent (node01, enforce, gpu_reset and node_reboot automatic) per test on one module-wide simulated rack and
Slurm; each test starts from a clean rack (faults cleared, every node resumed) and a fresh agent, so no judge
memory carries over.

- XID 13 (RESTART_APP): the job is told (its Comment), the node stays in service; five on the same GPU within the
  window: the GPU is at fault, the node drains (service).
- XID 48 (DBE, reset class): drain, the reset waits while a process runs on the GPU, reset once idle, health read,
  the node resumes.
- XID 79 (off the bus, RESTART_BM): scontrol reboot through real slurmctld and its RebootProgram; the node comes
  back (BootTime later), resumed, the GPU back on the bus.
- Row remap pending: reset at the next idle point (the remap applied), the node resumes.
- Row remap failure: service, the node stays drained.
- A reset that does not clear the fault (it recurs): the ladder escalates to a reboot, which clears it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sim.demo import agent_config
from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import free_port, require_binary, wait_for
from sim.slurm_cluster import simulator_reboot_command
from tests.slurm import SlurmCluster, batch_job, node_states

TOKEN = "token-for-tests"
RACK = ["node01", "node02"]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """(simulated rack, Slurm whose RebootProgram reboots the simulated node)."""
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "squeue", "unshare"):
        require_binary(b)
    base = tmp_path_factory.mktemp("ladder")
    with sim_rack(base / "rack", nodes=2, gpus=2) as rack:
        on_reboot = simulator_reboot_command(rack.url)
        cluster = SlurmCluster(names=RACK, base=base / "slurm", on_reboot=on_reboot).start()
        try:
            yield rack, cluster
        finally:
            cluster.cleanup()


@pytest.fixture
def clean(ladder):
    rack, cluster = ladder
    rack.clear()
    for n in RACK:
        cluster.scontrol("update", f"NodeName={n}", "State=RESUME")
    wait_for(lambda: all(node_states(cluster).get(n) == "idle" for n in RACK), 60, what="rack idle")
    return rack, cluster


def _config(rack, cluster: SlurmCluster, tmp_path: Path) -> dict[str, Any]:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
    rem = cfg["remediation"]
    rem["guardrails"].update(cooldown_seconds=0, automatic=["gpu_reset", "node_reboot"])
    rem["gpu_recovery"] = {**rem.get("gpu_recovery", {}), "job_notify": "comment", "idle_wait_seconds": 120,
                           "reboot_timeout_seconds": 120, "verify_seconds": 15}
    rem["detectors"] = {"gpu_app_fault": {"fire_seconds": 0, "clear_seconds": 3}}
    return cfg


def _journal(agent, **match: str) -> list[dict]:
    status, body = agent.get("/api/v1/journal?limit=2000", token=TOKEN)
    assert status == 200, body
    return [e for e in json.loads(body)["entries"] if all(e.get(k) == v for k, v in match.items())]


def _incidents(agent, detector: str) -> list[dict]:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    assert status == 200, body
    data = json.loads(body)
    return [i for i in data["open"] + data["recent"] if i["detector"] == detector]


def _done(agent, action: str) -> list[dict]:
    return _journal(agent, kind="result", action=action, result="done")


def _job_comment(cluster: SlurmCluster, job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%k"], capture_output=True, text=True, env=cluster.env,
                         timeout=10)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _boot_time(cluster: SlurmCluster, node: str) -> str:
    out = cluster.scontrol("show", "node", "-o", node)
    assert out.returncode == 0, out.stderr
    return next(f.split("=", 1)[1] for f in out.stdout.split() if f.startswith("BootTime="))


def test_xid13_tells_the_job_and_five_on_one_gpu_drain_the_node(clean, tmp_path):
    rack, cluster = clean
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 300\n")
    with batch_job(cluster, script, "node01") as job, \
            running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        wait_for(lambda: node_states(cluster).get("node01") in ("allocated", "mixed"), 30, what="job running")
        rack.inject("xid", node="node01", gpu=0, code=13)
        told = wait_for(lambda: _done(agent, "job_notify"), 30, what="job told")
        assert job in json.dumps(told[0]["detail"])
        assert "XID 13" in _job_comment(cluster, job) and _job_comment(cluster, job).startswith("supernode-agent:")
        inc = _incidents(agent, "gpu_app_fault")[0]
        assert inc["targets"] == {"node": "node01", "gpu": "0"}
        assert not _journal(agent, action="drain")  # an application fault leaves the node in service
        assert node_states(cluster)["node01"] in ("allocated", "mixed")
        for _ in range(4):  # the same XID on the same GPU again and again: the GPU, not the job
            rack.inject("xid", node="node01", gpu=0, code=13)
        wait_for(lambda: _done(agent, "drain"), 30, what="drained after the fifth XID 13")
        service = _incidents(agent, "gpu_service_required")
        assert service and service[0]["targets"] == {"node": "node01", "gpu": "0"}
        assert "13" in json.dumps(service[0]["detail"])
        assert node_states(cluster)["node01"] in ("draining", "drained")


def test_xid48_drains_resets_the_gpu_once_idle_and_resumes(clean, tmp_path):
    rack, cluster = clean
    with running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("xid", node="node01", gpu=0, code=48, sticky=True)
        wait_for(lambda: _done(agent, "drain"), 30, what="drained")
        # a process still runs on GPU 0: the reset waits (its intent says so), nothing is reset yet
        wait_for(lambda: _journal(agent, kind="intent", action="gpu_reset"), 30, what="reset planned")
        assert not _journal(agent, kind="result", action="gpu_reset")
        assert rack.sim.model.gpu("node01", 0).xid_faults
        rack.inject("workload", node="node01", gpu=0, ratio=0)  # the job is gone
        try:
            reset = wait_for(lambda: _done(agent, "gpu_reset"), 60, what="GPU reset")
        except AssertionError:
            print("journal and agent log at the failure:", json.dumps(_journal(agent), indent=1)[-6000:], agent.log()[-4000:])
            raise
        assert reset[0]["target"] == "gpu=0,node=node01"
        assert not rack.sim.model.gpu("node01", 0).xid_faults
        wait_for(lambda: node_states(cluster).get("node01") == "idle", 60, what="resumed after the reset")
        checks = _journal(agent, kind="health_check")
        assert checks and checks[-1]["result"] == "passed"
        drained, reset_at = _done(agent, "drain")[0]["ts"], reset[0]["ts"]
        # Slurm reads the node idle as soon as the resume's scontrol returns; its journal row follows
        resumed = wait_for(lambda: _journal(agent, kind="result", action="drain", result="undone"), 30,
                           what="the drain's undo journaled")
        assert drained < reset_at < resumed[0]["ts"]
        assert not _journal(agent, action="node_reboot")


def test_xid79_reboots_the_node_through_slurm_and_it_comes_back(clean, tmp_path):
    rack, cluster = clean
    boot_id, boot_time = rack.sim.state()["nodes"]["node01"]["boot_id"], _boot_time(cluster, "node01")
    with running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("xid", node="node01", gpu=1, code=79, sticky=True)
        rebooted = wait_for(lambda: _done(agent, "node_reboot"), 150, what="node rebooted through Slurm")
        assert rack.sim.state()["nodes"]["node01"]["boot_id"] != boot_id  # the RebootProgram rebooted it
        assert _boot_time(cluster, "node01") != boot_time
        assert not rack.sim.model.gpu("node01", 1).lost  # back on the bus
        assert "verify" in rebooted[0]["detail"].get("after", rebooted[0]["detail"])
        wait_for(lambda: node_states(cluster).get("node01") == "idle", 60, what="node back in service")
        inc = _incidents(agent, "gpu_reboot_required")
        assert inc and inc[0]["targets"] == {"node": "node01"}
        wait_for(lambda: _incidents(agent, "gpu_reboot_required")[0]["state"] == "resolved", 60,
                 what="reboot incident resolved")


def test_a_pending_row_remap_is_reset_once_idle_and_the_node_resumes(clean, tmp_path):
    """Row remap pending: a reset at the next idle point applies it (NVIDIA: the remap takes effect at the next
    GPU reset). The reset class: drain, the reset waits for the GPU's process, resets, verifies, resumes."""
    rack, cluster = clean
    with running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("row-remap", node="node01", gpu=1, state="pending")
        wait_for(lambda: _done(agent, "drain"), 30, what="drained for the pending remap")
        (inc,) = _incidents(agent, "gpu_reset_required")
        assert inc["targets"] == {"node": "node01", "gpu": "1"} and inc["detail"]["rule"] == "row_remap_pending"
        wait_for(lambda: _journal(agent, kind="intent", action="gpu_reset"), 30, what="reset planned")
        assert rack.sim.model.gpu("node01", 1).remap_pending  # a process still runs: nothing reset yet
        rack.inject("workload", node="node01", gpu=1, ratio=0)  # the job is gone: the idle point
        reset = wait_for(lambda: _done(agent, "gpu_reset"), 60, what="GPU reset")
        assert reset[0]["target"] == "gpu=1,node=node01"
        assert not rack.sim.model.gpu("node01", 1).remap_pending  # applied at the reset
        wait_for(lambda: node_states(cluster).get("node01") == "idle", 60, what="resumed after the reset")
        assert not _journal(agent, action="node_reboot")


def test_row_remap_failure_is_service_and_the_node_stays_drained(clean, tmp_path):
    rack, cluster = clean
    with running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("row-remap", node="node01", gpu=0, state="failed")
        wait_for(lambda: _done(agent, "drain"), 30, what="drained")
        inc = _incidents(agent, "gpu_service_required")[0]
        assert inc["targets"] == {"node": "node01", "gpu": "0"} and inc["state"] != "resolved"
        assert not _journal(agent, action="gpu_reset") and not _journal(agent, action="node_reboot")
        # more polls of the NVML source go by: nothing undoes the drain
        polled = _last_poll(agent)
        wait_for(lambda: _last_poll(agent) >= polled + 5, 30, what="five more seconds of NVML polls")
        assert not _journal(agent, kind="result", action="drain", result="undone")
        assert node_states(cluster)["node01"] in ("draining", "drained")
        assert _incidents(agent, "gpu_service_required")[0]["state"] != "resolved"


def _last_poll(agent) -> float:
    for line in agent.metrics().splitlines():
        if line.startswith("supernode_source_last_success_timestamp_seconds{") and 'source="nvml"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no nvml last-success time on /metrics")


def test_a_reset_that_does_not_clear_the_fault_escalates_to_a_reboot(clean, tmp_path):
    rack, cluster = clean
    boot_id = rack.sim.state()["nodes"]["node01"]["boot_id"]
    rack.inject("workload", node="node01", gpu=0, ratio=0)
    with running_agent(_config(rack, cluster, tmp_path), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("xid", node="node01", gpu=0, code=48, sticky=True, recurs=True)
        failed = wait_for(lambda: _journal(agent, kind="result", action="gpu_reset", result="failed"), 60,
                          what="the reset fails its verification")
        assert "did not clear" in json.dumps(failed[0]["detail"])
        wait_for(lambda: _done(agent, "node_reboot"), 150, what="escalated to a reboot")
        assert rack.sim.state()["nodes"]["node01"]["boot_id"] != boot_id
        assert not rack.sim.model.gpu("node01", 0).xid_faults
        wait_for(lambda: node_states(cluster).get("node01") == "idle", 60, what="node back in service")
        assert _incidents(agent, "gpu_reboot_required")
