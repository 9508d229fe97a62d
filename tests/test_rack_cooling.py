"""Issue 35 across the rack, with real agents in `static` coordination on the simulated rack (an HGX rack: no
NVLink domain, so the trays' vectors carry their load and cooling summaries alone).

node01 and node02 run real agents; node03's agent URL is a peer this test serves, first with a garbled cooling
summary, then with a valid one of a tray with no GPU under power. Each tray has two GPUs: no cold plate has
tray mates enough for a tray median (cold_plate_min_peers 2), and no baseline is learnt (an hour's learning),
so only the rack's reference (the other trays' loaded GPUs) can show a fouled plate.

- a peer's garbled summary is refused and counted; it is no reference (node01 counts node02's GPUs only);
- a fouled plate on a two-GPU tray opens cold_plate_degraded against the rack; a tray whose every plate fouled
  opens one incident for the tray;
- a pump lost while node03's summary is garbage: each tray sheds its own share, journaled as such;
- a pump lost with every tray's summary: one plan across the trays from the summaries sent before the loss, the
  same on both agents, the hotter tray cut more, the cuts summing to the rack's shed; restored when it runs.

(etcd carries the same vectors through `links/<node>` and the same `LinkShare.accept`; tests/
test_nvlink_attribution_rack.py runs it there.)
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from typing import Any

import pytest

from agent.remediation.actions.margin_cap import ONSET_MARGIN_SECONDS
from sim.harness import SimRack
from tests.agentproc import AgentProcess
from tests.coordination_rack import incidents, journal, metric, static_configs
from tests.helpers import free_port, wait_for

NODES = ["node01", "node02", "node03"]
R = "supernode_gpu_thermal_resistance_kelvin_per_watt"


class Peer:
    """node03's agent as the others see it: its links feed (one line, sent again every second) and its
    maintenance answer, served on the simulated rack's event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.cool: Any = "garbage"

    def line(self) -> bytes:
        cool = {"cdu": "cdu1", "flow": 0.005, "g": {"0": [-1.0, 1e9, 40.0, 200.0], "1": [-1.0, 1e9, 40.0, 200.0]}} \
            if self.cool == "garbage" else self.cool
        return json.dumps({"v": 1, "node": "node03", "at": time.time(), "gpus": {}, "cool": cool}).encode() + b"\n"

    async def start(self) -> None:
        from aiohttp import web

        async def links(request: Any) -> Any:
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            try:
                while True:
                    await resp.write(self.line())
                    await asyncio.sleep(1.0)
            except ConnectionError:  # the agent went away (stopped, or its feed restarted)
                pass
            return resp

        async def maintenance(request: Any) -> Any:
            return web.json_response({"node": "node03", "maintenance": None})

        app = web.Application()
        app.router.add_get("/api/v1/coordination/links", links)
        app.router.add_get("/api/v1/coordination/maintenance", maintenance)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    base = tmp_path_factory.mktemp("rack-cooling")
    sim = SimRack(base, nodes=3, gpus=2).start()
    peer = Peer()
    sim.call(peer.start())
    agents: list[AgentProcess] = []
    try:
        for cfg, work in static_configs(sim.sim, base, NODES, {})[:2]:
            cfg["inventory"]["agent_urls"]["node03"] = f"http://127.0.0.1:{peer.port}"
            # the Modbus CDU alone: one coolant incident per agent, one derate plan to compare across the agents
            cfg["inventory"]["redfish"] = [e for e in cfg["inventory"]["redfish"] if e["kind"] != "cdu"]
            cfg["sources"]["thermal_resistance"] = {"interval": 1.0, "timeout": 1.0, "settle_seconds": 2.0,
                                                    "smoothing_seconds": 2.0, "baseline_learn_seconds": 3600.0}
            cfg["remediation"].setdefault("detectors", {}).update(
                flow_setpoint_settle_seconds=0, cold_plate_degraded={"fire_seconds": 3.0, "clear_seconds": 3.0},
                coolant_flow_low={"fire_seconds": 1.0, "clear_seconds": 2.0},
                pump_redundancy_lost={"fire_seconds": 0.0, "clear_seconds": 1.0})
            agents.append(AgentProcess(cfg, work).start())
        yield sim, peer, agents
    finally:
        for a in agents:
            a.stop()
        sim.call(peer.runner.cleanup())
        sim.stop()


def _cold_plates(agent: AgentProcess) -> dict[str, dict]:
    return {i["targets"].get("gpu", "tray"): i for i in incidents(agent)["open"]
            if i["detector"] == "cold_plate_degraded"}


def _loaded(agent: AgentProcess) -> int:
    return len(re.findall(rf"^{R}{{", agent.metrics(), re.M))


def _clear(sim: SimRack, agents: list[AgentProcess]) -> None:
    sim.clear()
    wait_for(lambda: not any(i["detector"] in ("cold_plate_degraded", "coolant_flow_low", "pump_redundancy_lost")
                             for a in agents for i in incidents(a)["open"]), 90, what="the cooling incidents closed")


def test_a_peers_garbled_summary_is_refused_counted_and_never_a_reference(rack):
    sim, peer, (node01, node02) = rack
    wait_for(lambda: _loaded(node01) == 2 and _loaded(node02) == 2, 90, what="R of every GPU of both trays")
    wait_for(lambda: metric(node01, "supernode_gpu_thermal_resistance_rack_peers") == 2.0, 60,
             what="node01's rack reference from node02's two GPUs")
    assert (metric(node01, "supernode_coordination_rejected_records_total", key_kind="links", why="range") or 0) >= 1
    assert metric(node01, "supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt") is not None
    assert not _cold_plates(node01) and not _cold_plates(node02)


def test_a_fouled_plate_on_a_two_gpu_tray_and_a_tray_of_fouled_plates_stand_out_against_the_rack(rack):
    sim, peer, agents = rack
    node01, node02 = agents
    wait_for(lambda: metric(node02, "supernode_gpu_thermal_resistance_rack_peers") == 2.0, 60,
             what="node02's rack reference from node01's two GPUs")
    try:
        sim.inject("cold-plate-fouling", node="node01", gpu=1, percent=40)
        inc = wait_for(lambda: _cold_plates(node01).get("1"), 90, what="cold_plate_degraded on node01 gpu 1")
        assert inc["detail"]["off"] == ["rack"] and inc["detail"]["peers_median_kelvin_per_watt"] is None
        assert inc["detail"]["temperature_celsius"] < inc["detail"]["slowdown_celsius"]
        assert set(_cold_plates(node01)) == {"1"} and not _cold_plates(node02)
        _clear(sim, agents)
        for gpu in (0, 1):
            sim.inject("cold-plate-fouling", node="node02", gpu=gpu, percent=40)
        tray = wait_for(lambda: _cold_plates(node02).get("tray"), 90, what="cold_plate_degraded for node02's tray")
        assert tray["targets"] == {"node": "node02"} and tray["detail"]["off"] == ["rack"]
        assert set(_cold_plates(node02)) == {"tray"} and not _cold_plates(node01)
    finally:
        _clear(sim, agents)


def _derates(agent: AgentProcess, since: int) -> dict[str, dict]:
    """The derate each cap step planned after `since`, by GPU index (the latest)."""
    out = {}
    for e in journal(agent):
        if e["seq"] > since and e["kind"] == "intent" and e["action"] == "gpu_power_cap" \
                and "derate" in (e["detail"].get("plan") or {}):
            out[re.search(r"gpu=(\d+)", e["target"]).group(1)] = e["detail"]["plan"]["derate"]
    return out


def _limits(sim: SimRack, node: str) -> list[float]:
    with sim.sim.model.lock:
        return [g.power_limit_mw / 1000 for g in sim.sim.model.nodes[node].gpus]


def _power_settled(sim: SimRack) -> bool:
    """Every GPU of the agents' trays draws what its workload demands within its limit (0.5 W): no power is
    still climbing back after a cap."""
    with sim.sim.model.lock:
        gpus = [g for n in NODES[:2] for g in sim.sim.model.nodes[n].gpus]
        return all(abs(g.power_w - g.target_power_w) < 0.5 for g in gpus)


def _sent_at(agent: AgentProcess) -> float:
    """When the tray vector this agent serves its peers now was built (the first line of its links feed)."""
    port = agent.config["listen"]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/coordination/links", timeout=10) as feed:
        return float(json.loads(feed.readline())["at"])


def _capped(sim: SimRack, agents: list[AgentProcess], fault: str, **params: Any) -> tuple[dict, dict]:
    """Inject a fault of the loop; (the limits before, each agent's derate of its two GPUs) once all are capped."""
    since = {a: max((e["seq"] for e in journal(a)), default=0) for a in agents}
    before = {n: _limits(sim, n) for n in ("node01", "node02")}
    sim.inject(fault, **params)
    wait_for(lambda: all(w < b for n in before for w, b in zip(_limits(sim, n), before[n])), 60,
             what="every GPU of both trays capped")
    plans = {a.config["agent"]["node"]: wait_for(lambda: (d := _derates(a, since[a])) and len(d) == 2 and d, 30,
                                                 what="both GPUs' derate journaled") for a in agents}
    return before, plans


def _restored(sim: SimRack, before: dict[str, list[float]]) -> None:
    """The loop recovers (both pumps run): every limit as it was before the derate."""
    with sim.sim.model.lock:
        sim.sim.model.coolant.pump_running[1] = True
    wait_for(lambda: all(_limits(sim, n) == before[n] for n in before), 90, what="the limits restored")


def test_a_pump_lost_while_a_loop_trays_summary_is_garbage_sheds_each_trays_own_share(rack):
    sim, peer, agents = rack
    before, plans = _capped(sim, agents, "pump-fail", cdu="cdu1", pump=2)
    try:
        for node, derate in plans.items():
            d = derate["0"]
            assert d["method"] == "thermal_margin" and d["share"] == "tray", d
            assert "node03" in d["share_why"], d["share_why"]
    finally:
        _restored(sim, before)
        _clear(sim, agents)


def test_a_pump_lost_is_shed_across_the_trays_by_margin_the_same_plan_on_both_agents(rack):
    """Each agent plans from every tray's summary as it was sent before the loop changed (the incident's onset
    less 5 s): both find the same steady figures, which the dies heating after the pump loss have not
    reordered."""
    sim, peer, agents = rack
    node01, node02 = agents
    peer.cool = {"cdu": "cdu1", "flow": None, "g": {}}  # node03: a tray with no GPU under power
    for gpu in (0, 1):  # node02's plates run hotter: the smaller margin
        sim.inject("thermal", node="node02", gpu=gpu, celsius=8)
    wait_for(lambda: all(metric(a, "supernode_gpu_thermal_resistance_rack_peers") == 2.0 for a in agents), 60,
             what="node03's summary taken")
    rack_r = "supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt"
    # node02's hotter plates in the summary it shares: node01's rack reference (node02's R) well above node02's
    # (node01's R), so both agents plan from the same, hotter, node02
    wait_for(lambda: (metric(node01, rack_r) or 0) > 1.15 * (metric(node02, rack_r) or 1e9), 60,
             what="node02's hotter plates in its shared summary")
    # and every summary a plan can pick sent in a steady state: the last test's caps undone and every GPU's power
    # back at its demand (it climbs back over seconds), then a summary of each tray sent since, and the time the plan
    # looks back before its onset (ONSET_MARGIN_SECONDS) past: each tray's last summary before that instant is a
    # steady one, whichever agent's onset it is (a summary sent during the climb, picked by one agent and not the
    # other, is the one difference the plans may have: a rack that was not steady before the loop changed)
    wait_for(lambda: _power_settled(sim), 60, interval=0.5, what="every GPU's power back at its demand")
    steady = time.time()
    wait_for(lambda: all(_sent_at(a) > steady for a in agents), 40, interval=0.5, what="steady summaries sent")
    ready = time.time()
    wait_for(lambda: all(_sent_at(a) > ready + ONSET_MARGIN_SECONDS + 0.5 for a in agents), 40, interval=0.5,
             what="the look-back instant past a steady summary of each tray")
    before, plans = _capped(sim, agents, "pump-fail", cdu="cdu1", pump=2)
    try:
        one, two = plans["node01"]["0"], plans["node02"]["0"]
        assert one["share"] == two["share"] == "rack" and one["trays"] == ["node01", "node02", "node03"], one
        # the same plan on both agents: the same summaries (the rack's power, the split of the shed between the
        # trays); only the share to shed is each agent's own reading of the CDU, a moment apart while the flow
        # settles after the pump (the re-plan follows it). The exact equality of plans from the same inputs is
        # tests/test_derate.py's property.
        assert one["rack_power_watts"] == two["rack_power_watts"], (one, two)

        def split(plan: dict) -> dict[str, float]:
            return {n: w / sum(plan["tray_cuts_watts"].values()) for n, w in plan["tray_cuts_watts"].items()}
        assert split(one) == pytest.approx(split(two), abs=0.002), (one, two)
        cuts = one["tray_cuts_watts"]
        assert cuts["node02"] > cuts["node01"] + 10 and cuts.get("node03", 0.0) == 0.0, cuts
        # what each agent applied: its own tray's cuts of its own plan, the trays summing to the rack's shed
        applied = {n: sum(g["cut_watts"] for g in plans[n]["0"]["gpus"].values()) for n in plans}
        for n, plan in plans.items():
            assert applied[n] == pytest.approx(plan["0"]["tray_cuts_watts"][n], abs=1.0), (n, plan["0"])
            assert sum(plan["0"]["tray_cuts_watts"].values()) == pytest.approx(plan["0"]["rack_shed_watts"], abs=1.0)
        # each agent sheds its tray's part of the rack's shed as it computed it: the total applied lies between
        # the two agents' computed sheds (equal when they read the CDU at the same moment)
        sheds = sorted(p["0"]["rack_shed_watts"] for p in plans.values())
        assert sheds[0] - 1.0 <= sum(applied.values()) <= sheds[1] + 1.0, (applied, sheds)
        for n in plans:
            gpus = plans[n]["0"]["gpus"]
            assert [round(w) for w in _limits(sim, n)] == [round(gpus[str(i)]["limit_watts"]) for i in range(2)]
            assert all(gpus[str(i)]["limit_watts"] >= gpus[str(i)]["min_watts"] for i in range(2))
    finally:
        _restored(sim, before)
        _clear(sim, agents)
