"""Issue 34: no tray drained for the NVLink fabric resumes until its GPUs' fabric state reads completed/success.

The real daemon on a simulated GB200 rack (the NVML twin) with the real Slurm of tests/test_judgement.py.
A link failing takes its GPU off the fabric (fault `fabric-state`): the node is drained for nvlink_errors,
and when the link errors stop the node stays out while the GPU's registration is in_progress, either held by
the gpu_fabric_degraded incident or, with that detector off, by the resume health read itself; it goes back
to its jobs by itself once the registration completes.
"""

from __future__ import annotations

from tests.agentproc import running_agent
from tests.helpers import wait_for
from sim.harness import sim_rack
from tests.slurm import node_states
from tests.test_judgement import _config, _incidents, _journal, clean_cluster, cluster  # noqa: F401 (fixtures)

FAST = {"fire_seconds": 0, "clear_seconds": 3}


def _drained(slurm) -> bool:
    return node_states(slurm).get("node01") in ("drained", "draining")


def test_a_node_drained_for_nvlink_errors_waits_in_the_health_read_for_the_fabric(clean_cluster, tmp_path):  # noqa: F811
    """gpu_fabric_degraded off: the resume health read alone keeps the node out while the GPU is off the fabric."""
    slurm = clean_cluster
    with sim_rack(tmp_path, nodes=2, gpus=2, personality="gb200") as rack:
        cfg = _config(rack, tmp_path, slurm.conf, nvlink_errors=FAST,
                      gpu_fabric_degraded={**FAST, "enabled": False})
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("fabric-state", node="node01", gpu=0, state="in_progress")
            rack.inject("nvlink-errors", node="node01", gpu=0, link=3, rate=500)
            wait_for(lambda: _journal(agent, kind="result", action="drain", result="done"), 30, what="drained")
            rack.inject("nvlink-errors", node="node01", gpu=0, link=3, rate=0)
            check = wait_for(lambda: _journal(agent, kind="health_check"), 60, what="resume health check")
            assert check[0]["result"] == "failed", check
            assert check[0]["detail"]["why"] == "GPU 0: not registered with the NVLink fabric (state in_progress)"
            pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "drain"],
                               10, what="resume waits for a person")
            assert pending[0]["approval"] == "resume_after_check"
            assert _drained(slurm)


def test_a_node_drained_for_nvlink_errors_resumes_by_itself_once_its_gpu_is_back_on_the_fabric(clean_cluster, tmp_path):  # noqa: F811
    slurm = clean_cluster
    with sim_rack(tmp_path, nodes=2, gpus=2, personality="gb200") as rack:
        cfg = _config(rack, tmp_path, slurm.conf, nvlink_errors=FAST, gpu_fabric_degraded=FAST)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("fabric-state", node="node01", gpu=0, state="in_progress")
            rack.inject("nvlink-errors", node="node01", gpu=0, link=3, rate=500)
            wait_for(lambda: {"nvlink_errors", "gpu_fabric_degraded"} <= {
                i["detector"] for i in _incidents(agent)["open"]}, 30, what="both incidents open")
            wait_for(lambda: _drained(slurm), 30, what="drained")
            rack.inject("nvlink-errors", node="node01", gpu=0, link=3, rate=0)
            # the link is quiet and its incident resolves; the drain is kept: its GPU is still off the fabric
            kept = wait_for(lambda: _journal(agent, kind="result", action="drain", result="kept"), 60,
                            what="drain kept by the fabric incident")
            assert kept[0]["detail"]["phase"] == "undo"
            # (on a starved machine a leak source can miss its polls: its leak_source_down is right, and not this
            # test's business; the NVLink incident must be gone and the fabric's still open)
            still = {i["detector"] for i in _incidents(agent)["open"]}
            assert "gpu_fabric_degraded" in still and "nvlink_errors" not in still, still
            assert _drained(slurm) and not _journal(agent, kind="health_check")
            rack.inject("fabric-state", node="node01", gpu=0, state="completed")
            wait_for(lambda: node_states(slurm).get("node01") == "idle", 60, what="resumed once back on the fabric")
            check = _journal(agent, kind="health_check")
            assert [c["result"] for c in check] == ["passed"], check
            assert "on the NVLink fabric" in check[0]["detail"]["why"]
