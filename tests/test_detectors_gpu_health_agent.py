"""Issue 33's GPU health causes and stragglers with the real daemon on the simulated rack (the NVML twin).

A PCIe link trained down (`inject pcie-downtrain`) opens gpu_pcie_degraded; a power brake (`inject
clock-slowdown --reason hw_power_brake`) opens gpu_clock_slowdown and, its SM clock halved among busy peers,
gpu_straggler naming clock_slowdown; a GPU slowed with no reason opens gpu_straggler "unexplained". Every one
only notifies (no cap, no drain), and all clear once the faults are gone.
"""

from __future__ import annotations

import json
import re

from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import wait_for
from tests.test_detectors_agent import TOKEN, _config, _incidents

HOLD = {"fire_seconds": 2.0, "clear_seconds": 2.0}


def _open(agent, detector: str) -> dict[str, dict]:
    """gpu -> the open incident of `detector` on node01."""
    return {i["targets"]["gpu"]: i for i in _incidents(agent)["open"]
            if i["detector"] == detector and i["targets"].get("node") == "node01"}


def _width(text: str, gpu: str, kind: str) -> float | None:
    m = re.search(rf'^supernode_gpu_pcie_link_width\{{gpu="{gpu}",kind="{kind}",uuid="[^"]*"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_pcie_downtraining_a_power_brake_and_an_unexplained_slow_gpu_open_their_incidents(tmp_path):
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path, gpu_pcie_degraded=HOLD, gpu_clock_slowdown=HOLD, gpu_straggler=HOLD)
        gpus = rack.sim.model.nodes["node01"].gpus
        assert len(gpus) >= 4  # three busy peers make the median
        limits = [g.power_limit_mw for g in gpus]
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: _width(agent.metrics(), "1", "max") == 16.0, 60, what="the PCIe link read")
            assert not _open(agent, "gpu_straggler")  # healthy busy GPUs are in line

            rack.inject("pcie-downtrain", node="node01", gpu=1, width=8)
            pcie = wait_for(lambda: _open(agent, "gpu_pcie_degraded").get("1"), 60,
                            what="gpu_pcie_degraded on node01 gpu 1")
            assert (pcie["severity"], pcie["detail"]["width"], pcie["detail"]["max_width"]) == ("warning", 8, 16)
            assert _width(agent.metrics(), "1", "current") == 8.0

            rack.inject("clock-slowdown", node="node01", gpu=2, reason="hw_power_brake")
            slow = wait_for(lambda: _open(agent, "gpu_clock_slowdown").get("2"), 60,
                            what="gpu_clock_slowdown on node01 gpu 2")
            assert slow["detail"]["reasons"] == ["hw_power_brake", "hw_slowdown"]
            straggler = wait_for(lambda: _open(agent, "gpu_straggler").get("2"), 60,
                                 what="gpu_straggler on node01 gpu 2")
            assert straggler["detail"]["cause"] == "clock_slowdown"
            assert straggler["detail"]["off"] == ["sm_clock"]

            rack.inject("clock-slowdown", node="node01", gpu=3, reason="none", ratio=0.6)
            unexplained = wait_for(lambda: _open(agent, "gpu_straggler").get("3"), 60,
                                   what="gpu_straggler on node01 gpu 3")
            assert unexplained["detail"]["cause"] == "unexplained"
            assert "3" not in _open(agent, "gpu_clock_slowdown")  # no reason reported: no slowdown incident
            assert "1" not in _open(agent, "gpu_straggler")  # a narrow link alone does not slow the SM clock

            rack.clear()
            for detector in ("gpu_pcie_degraded", "gpu_clock_slowdown", "gpu_straggler"):
                wait_for(lambda: not _open(agent, detector), 60, what=f"{detector} cleared")
            status, body = agent.get("/api/v1/journal", token=TOKEN)
            assert status == 200, body
            ids = {i["id"] for i in (pcie, slow, straggler, unexplained)}
            # Their playbooks' only step is notify (no notify_url here: recorded not_configured): no cap, no drain.
            acted = {e["action"] for e in json.loads(body)["entries"] if e.get("incident_id") in ids and e.get("action")}
            assert acted == {"notify"}, acted
            assert [i["playbook"] for i in (pcie, slow, straggler)] == ["gpu-pcie-degraded", "gpu-clock-slowdown",
                                                                        "gpu-straggler"]
            assert [g.power_limit_mw for g in gpus] == limits
