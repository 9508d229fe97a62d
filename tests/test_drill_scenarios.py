"""The drill's other faults end to end: a tray leak, an XID, a link down, a flow loss and a switch fault, each entering
as a synthetic reading marked drill where the device's would, handled by the real daemon's detectors, guardrails
and playbooks as a real fault, against a real single-host Slurm and the simulated rack (one agent for the module).

Each test runs one drill as an operator starts it (POST /api/v1/drill, as `supernode-agent drill` does) and checks
its report (every stage PASS), what it did for real and what stayed dry-run, that its incident says drill, that
the real state it stood in for is untouched, and that promtool finds no shipped alert firing on its series."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sim.demo import agent_config
from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import free_port, wait_for
from tests.slurm import node_states, running_cluster
from tests.test_drill import DRAINED, TOKEN, assert_no_shipped_alert_fires, journal, since

ENDED = ("passed", "failed", "aborted")


class _Notices(BaseHTTPRequestHandler):
    """The notify_url's receiver: every event the agent's notify steps POST."""

    got: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).got.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Rig:
    rack: Any
    cluster: Any
    agent: Any
    notices: list[dict] = field(default_factory=list)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drill-scenarios")
    for name in ("admin.token", "webhook.token"):
        (tmp / name).write_text(TOKEN + "\n")
    receiver = ThreadingHTTPServer(("127.0.0.1", free_port()), _Notices)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    cluster_gen = running_cluster(["node01", "node02"], "scontrol")
    cluster = next(cluster_gen)
    try:
        with sim_rack(tmp) as rack:
            cfg = agent_config(rack.sim, "node01", free_port(), tmp, mode="enforce", slurm_conf=cluster.conf)
            rem = cfg["remediation"]
            rem["notify_url"] = f"http://127.0.0.1:{receiver.server_port}/events"
            # The shipped holds are minutes (a link must stay down 10 s, clear for 60 s); the drills here need
            # seconds: each detector fires at once and clears after 2 s of health.
            rem["detectors"] = {d: {"fire_seconds": 0.0, "clear_seconds": 2.0} for d in (
                "leak_tray", "gpu_reset_required", "nvlink_errors", "coolant_flow_low", "nvlink_switch_fault")}
            rem["guardrails"]["cooldown_seconds"] = 0  # each drill drains node01 again seconds after the last
            cfg["sources"]["leak"]["timeout"] = 2.0  # a loaded host's poll is no dry-hold gap (tests/test_drill.py)
            cfg["sources"]["nvml"].update(interval=2.0, timeout=4.0, gpu_timeout=3.0)  # nor a slow twin a hung GPU
            cfg["sources"]["cdu"]["timeout"] = 2.0  # nor a slow CDU poll a stale flow (a flow drill needs it read)
            with running_agent(cfg, tmp) as agent:
                wait_for(lambda: "supernode_cdu_flow_cubic_meters_per_second{" in agent.metrics()
                         and "supernode_nvlink_up{" in agent.metrics(), 60, what="the CDU and NVLink read")
                yield Rig(rack, cluster, agent, _Notices.got)
    finally:
        receiver.shutdown()
        cluster_gen.close()


@dataclass
class Drill:
    view: dict
    series: list[str]  # the drill="true" series /metrics served while it ran
    states: list[dict[str, str]]  # Slurm's node states sampled while it ran
    rows: list[dict]  # the journal's rows since it started

    @property
    def stages(self) -> list[tuple[str, str]]:
        return [(s["stage"], s["result"]) for s in self.view["report"]["stages"]]

    def passed(self, acted: str, detector: str) -> dict:
        """The drill's incident (its first row), once its every stage passed and its every incident is of
        `detector` and marked drill."""
        stages = self.view["report"]["stages"]
        assert self.view["state"] == "passed", [(s["stage"], s["seconds"], s["why"]) for s in stages]
        assert self.stages == [(s, "PASS") for s in ("detected", "decided", acted, "undo_done")], stages
        inc = [r for r in self.rows if r["kind"] == "incident" and r["detail"]["detail"].get("drill")]
        assert inc and {r["detail"]["detector"] for r in inc} == {detector}, inc
        return inc[0]


def run_drill(rig: Rig, scenario: dict, nodes: list[str], timeout: float = 180) -> Drill:
    after = since(rig.agent)
    # the fault held 2 s past its mitigation: a few samples of /metrics see its series whatever the host's load
    plan = {"name": f"{scenario['kind']}-drill", "scenario": scenario, "nodes": nodes, "hold_seconds": 2,
            "targets": {s: 60 for s in ("detected", "decided", "drained", "capped", "notified", "undo_done")}}
    status, body = rig.agent.request("POST", "/api/v1/drill", {"plan": plan}, token=TOKEN)
    assert status == 200, body
    series, states = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = json.loads(rig.agent.get("/api/v1/drill", token=TOKEN)[1])
        states.append(node_states(rig.cluster))
        series += [line for line in rig.agent.metrics().splitlines() if 'drill="true"' in line
                   and not line.startswith("#")]
        if view["state"] in ENDED:
            return Drill(view, series, states, journal(rig.agent, after))
        time.sleep(0.2)  # a sampling period: the loop ends on the drill's end
    raise AssertionError(f"drill {scenario} still {view['state']} after {timeout} s: {view['report']['stages']}")


def test_a_tray_leak_drill_drains_its_tray_and_the_one_below_and_powers_nothing_off(rig, tmp_path):
    d = run_drill(rig, {"kind": "tray_leak", "node": "node01"}, ["node01", "node02"])
    inc = d.passed("drained", "leak_tray")
    assert inc["detail"]["detail"]["drill_sensors"] == ["bmc-node01/drill"]
    # node01 (its tray) and node02 (the tray below, watched) drained for real, both resumed by the undo
    assert any(s["node01"] in DRAINED and s["node02"] in DRAINED for s in d.states), d.states
    assert not {node_states(rig.cluster)[n] for n in ("node01", "node02")} & set(DRAINED)
    # the tray's power off stayed dry-run: journaled, never done by the simulated BMC
    assert [a["action"] for a in d.view["report"]["dry_run"]] == ["tray_power"]
    assert rig.rack.sim.model.nodes["node01"].power_actions == []
    assert_no_shipped_alert_fires(d.series, tmp_path)


def test_an_xid_drill_drains_the_node_and_its_gpu_reset_stays_dry_run(rig, tmp_path):
    d = run_drill(rig, {"kind": "xid", "node": "node01", "gpu": 1, "xid": 48}, ["node01"])
    detail = d.passed("drained", "gpu_reset_required")["detail"]["detail"]
    assert detail["xid"] == 48 and detail["class"] == "reset"
    assert [(a["action"], a["target"]) for a in d.view["report"]["dry_run"]] == [("gpu_reset", "gpu=1,node=node01")]
    assert any(s["node01"] in DRAINED for s in d.states) and node_states(rig.cluster)["node01"] not in DRAINED
    # judged apart: the GPU's real history holds no XID 48 (no repeat rule will ever count the drill's)
    card = json.loads(rig.agent.get("/api/v1/status/node")[1])
    assert not [g for g in card["gpus"] if g.get("fault")], card["gpus"]
    assert any(line.startswith("supernode_gpu_xid_errors_total{") for line in d.series)
    assert_no_shipped_alert_fires(d.series, tmp_path)


def test_a_link_down_drill_drains_the_node_while_the_real_link_stays_up(rig, tmp_path):
    d = run_drill(rig, {"kind": "link_down", "node": "node01", "gpu": 0, "link": 2}, ["node01"])
    assert d.passed("drained", "nvlink_errors")["detail"]["detail"]["links_down"] == ["2"]
    # the stand-in was served beside the real series, which never read down
    assert any(line.startswith("supernode_nvlink_up{") and 'link="2"' in line and line.endswith(" 0.0")
               for line in d.series)
    real = [line for line in rig.agent.metrics().splitlines() if line.startswith("supernode_nvlink_up{")
            and 'gpu="0"' in line and 'link="2"' in line]
    assert real and all("drill" not in line and line.endswith(" 1.0") for line in real), real
    assert node_states(rig.cluster)["node01"] not in DRAINED
    assert_no_shipped_alert_fires(d.series, tmp_path)


def test_a_flow_loss_drill_caps_the_gpus_for_real_and_restores_them(rig, tmp_path):
    gpus = rig.rack.sim.model.nodes["node01"].gpus
    limits = [g.power_limit_mw for g in gpus]
    d = run_drill(rig, {"kind": "flow_loss", "cdu": "cdu1", "loss": 0.5}, ["node01"])
    assert d.passed("capped", "coolant_flow_low")["detail"]["detail"]["flow_ratio"] < 0.7
    capped = [r for r in d.rows if r["action"] == "gpu_power_cap" and r["result"] == "done"]
    assert {r["target"] for r in capped} == {f"gpu={i},node=node01" for i in range(len(gpus))}
    assert [g.power_limit_mw for g in gpus] == limits  # the undo restored every limit
    assert {line.split("{")[0] for line in d.series} >= {"supernode_cdu_flow_cubic_meters_per_second",
                                                          "supernode_cdu_temperature_celsius"}
    assert all(not any(v in DRAINED for v in s.values()) for s in d.states)  # a flow loss drains nothing
    assert_no_shipped_alert_fires(d.series, tmp_path)


def test_a_switch_fault_drill_names_the_switch_tray_and_drains_nothing(rig, tmp_path):
    seen = len(rig.notices)
    d = run_drill(rig, {"kind": "switch_fault", "switch_chip": 5, "switch_tray": "switch01"}, ["node01"])
    iid = d.passed("notified", "nvlink_switch_fault")["incident_id"]
    # the notice says it is a drill: whoever it reaches knows not to send someone to the switch tray (other
    # incidents' notices may come meanwhile: the rig's sources on a loaded host)
    notices = [n for n in rig.notices[seen:] if n["incident_id"] == iid]
    assert notices and all(n["drill"] is True and n["switch_tray"] == "switch01" for n in notices), notices
    assert all(not any(v in DRAINED for v in s.values()) for s in d.states)
    assert_no_shipped_alert_fires(d.series, tmp_path)
