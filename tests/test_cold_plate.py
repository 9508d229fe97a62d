"""Issue 35's cold plates on a deterministic clock: the derived thermal resistance (gate, smoothing, the persisted
baseline) and the detectors cold_plate_degraded and tray_flow_low, from hand-made NVML and CDU readings through
the real snapshot store; the same story with the real daemon on the simulated rack is in
tests/test_cold_plate_agent.py.

The readings follow the simulator's physics: T_gpu = T_supply + P * R, so a plate whose R is 30 % up reads 30 %
up whatever the power, while the GPU stays far below its slowdown temperature.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.config import ThermalResistanceSettings
from agent.derived_thermal import ThermalResistanceSource
from agent.remediation.detectors import Context, Detectors
from agent.remediation.settings import DetectorSettings
from agent.snapshot import SnapshotStore
from agent.thermal_baseline import FILE_NAME, ThermalBaselines
from exporters.cooling import modbus_metrics
from exporters.gpu import nvml_metrics as M
from exporters.model import Reading
from exporters.redfish import metrics as RF

SUPPLY = 25.0
FLOW = 0.005  # m^3/s on the secondary loop
SLOWDOWN = 87.0
CLEAN = 0.06  # K/W, the simulator's H100 plate


class Rack:
    """One node's NVML readings and its CDU's, published into a real SnapshotStore on a clock the test moves."""

    def __init__(self, tmp_path, gpus: int = 4, learn_seconds: float = 60.0, **settings):
        self.t = 1000.0
        self.store = SnapshotStore(clock=lambda: self.t)
        for source, device in (("nvml", "local"), ("modbus", "cdu1"), ("derived", "thermal_resistance")):
            self.store.register(source, device, 5.0, 1e9)
        self.gpus = gpus
        self.s = ThermalResistanceSettings(interval=5.0, settle_seconds=10.0, smoothing_seconds=10.0,
                                           baseline_learn_seconds=learn_seconds, **settings)
        self.path = tmp_path / FILE_NAME
        self.source = self._source("cdu1")
        self.r = [CLEAN] * gpus
        self.watts, self.util = 600.0, 0.9
        self.supply: float | None = SUPPLY

    def _source(self, cdu: str | None) -> ThermalResistanceSource:
        return ThermalResistanceSource(self.store, self.s, "node01", cdu,
                                       ThermalBaselines(self.path, self.s.baseline_learn_seconds, 5.0))

    def restart(self) -> None:
        """A new agent process: the source and its baselines built afresh from the state dir."""
        asyncio.run(self.source.close())
        self.source = self._source("cdu1")

    def temperature(self, gpu: int) -> float:
        return (self.supply or SUPPLY) + self.watts * self.r[gpu]

    def step(self, seconds: float = 5.0) -> list[Reading]:
        """Advance the clock, publish NVML and the CDU as they read now, then one derived poll; its readings."""
        self.t += seconds
        gpu = []
        for i in range(self.gpus):
            labels = {"gpu": str(i), "uuid": f"GPU-{i}"}
            gpu += [Reading(M.TEMPERATURE, self.temperature(i), {**labels, "sensor": "gpu"}, timestamp=self.t),
                    Reading(M.THRESHOLD, SLOWDOWN, {**labels, "threshold": "slowdown"}, timestamp=self.t),
                    Reading(M.POWER, self.watts, labels, timestamp=self.t),
                    Reading(M.POWER_LIMIT, 700.0, {**labels, "limit": "default"}, timestamp=self.t),
                    Reading(M.UTILIZATION, self.util, {**labels, "engine": "gpu"}, timestamp=self.t)]
        self.store.publish("nvml", "local", gpu, 0.01)
        cdu = [Reading(modbus_metrics.ALL["supernode_cdu_flow_cubic_meters_per_second"], FLOW,
                       {"cdu": "cdu1", "loop": "secondary"}, timestamp=self.t)]
        if self.supply is not None:
            cdu.append(Reading(modbus_metrics.ALL["supernode_cdu_temperature_celsius"], self.supply,
                               {"cdu": "cdu1", "loop": "secondary", "point": "supply"}, timestamp=self.t))
        self.store.publish("modbus", "cdu1", cdu, 0.01)
        out = asyncio.run(self.source.poll()).readings
        self.store.publish("derived", "thermal_resistance", out, 0.01)
        return out


def _values(readings: list[Reading], metric: str) -> dict[str, float]:
    return {r.label("gpu"): r.value for r in readings if r.spec.name == metric}


def _reasons(readings: list[Reading]) -> dict[str, str]:
    return {r.label("gpu"): r.label("reason") for r in readings
            if r.spec.name == "supernode_gpu_thermal_resistance_unavailable" and r.value == 1.0}


def _detectors(fire: float = 60.0, clear: float = 60.0) -> Detectors:
    return Detectors(DetectorSettings(cold_plate_degraded={"fire_seconds": fire, "clear_seconds": clear}),
                     Context("node01", "r01"))


def _run(rack: Rack, d: Detectors, seconds: float, step: float = 5.0) -> list:
    """Step the rack for `seconds`, evaluating the detectors after each step; the cold-plate events, in order."""
    events = []
    for _ in range(int(seconds / step)):
        rack.step(step)
        events += [e for e in d.evaluate(rack.store.snapshot()) if e.detector == "cold_plate_degraded"]
    return events


R = "supernode_gpu_thermal_resistance_kelvin_per_watt"
BASE = "supernode_gpu_thermal_resistance_baseline_kelvin_per_watt"


def test_r_is_the_rise_over_the_supply_per_watt_after_the_settle_time(tmp_path):
    rack = Rack(tmp_path)
    first = rack.step()
    assert _reasons(first) == {str(i): "settling" for i in range(4)} and not _values(first, R)
    for _ in range(3):
        out = rack.step()
    assert _values(out, R) == {str(i): CLEAN for i in range(4)}
    assert _reasons(out) == {}


def test_a_plate_fouled_30_percent_fires_against_its_peers_while_the_gpu_is_far_below_slowdown(tmp_path):
    """No history at all (no baseline learnt yet): the tray's other loaded GPUs are the reference."""
    rack, d = Rack(tmp_path, learn_seconds=1e6), _detectors(fire=60.0)
    assert _run(rack, d, 60) == []
    rack.r[2] = CLEAN * 1.3
    events = _run(rack, d, 50)
    assert events == []  # within the hold (and the smoothing): nothing yet
    events = _run(rack, d, 60)
    assert [(e.kind, e.targets) for e in events] == [("fire", {"node": "node01", "gpu": "2"})]
    detail = events[0].detail
    assert detail["scope"] == "gpu" and detail["off"] == ["peers"]
    assert detail["temperature_celsius"] < detail["slowdown_celsius"] == SLOWDOWN
    assert detail["thermal_resistance_kelvin_per_watt"] > detail["peers_median_kelvin_per_watt"] * 1.15
    rack.r[2] = CLEAN  # cleaned: it clears after its clear hold
    assert [e.kind for e in _run(rack, d, 120)] == ["clear"]


def test_a_short_gap_in_rs_inputs_restarts_neither_its_smoothing_nor_the_fire_hold(tmp_path):
    """A loaded host: the CDU's poll fails for 15 s in the middle of a fouled plate's 60 s hold. R's smoothing goes
    on where it was (no settle again) and the hold is not restarted: the warning comes at the end of the hold that
    began before the gap (bench_cooling's run that warned only at slowdown). A gap longer than 3 time constants
    of the smoothing starts R afresh, settle included."""
    rack, d = Rack(tmp_path, learn_seconds=1e6), _detectors(fire=60.0)
    _run(rack, d, 60)
    rack.r[2] = CLEAN * 1.3
    assert _run(rack, d, 20) == []  # above its peers from the second step (10 s): the hold runs
    rack.supply = None
    assert _run(rack, d, 15) == []
    assert _reasons(rack.step(0.0)) == {str(i): "no_supply_reading" for i in range(4)}
    rack.supply = SUPPLY
    back = rack.step(5.0)
    assert "2" in _values(back, R) and _reasons(back) == {}  # no settle again after a short gap
    events = _run(rack, d, 35)  # 75 s since the fouling: the hold that began at 10 s has run its 60 s
    assert [(e.kind, e.targets) for e in events] == [("fire", {"node": "node01", "gpu": "2"})]
    rack.supply = None
    _run(rack, d, 35)  # longer than 3 x the 10 s smoothing
    rack.supply = SUPPLY
    assert _reasons(rack.step(5.0)) == {str(i): "settling" for i in range(4)}


def test_no_r_and_no_incident_at_idle_load_the_gate(tmp_path):
    rack, d = Rack(tmp_path), _detectors(fire=0.0)
    rack.r[2] = CLEAN * 1.3
    rack.watts, rack.util = 120.0, 0.05  # idle: 17 % of the board power, no job
    events = _run(rack, d, 120)
    out = rack.step()
    assert events == [] and not _values(out, R)
    assert _reasons(out) == {str(i): "below_load_gate" for i in range(4)}
    rack.util = 0.9  # busy but at low power (a memory-bound phase): still gated on power
    out = rack.step()
    assert _reasons(out) == {str(i): "below_load_gate" for i in range(4)}


def test_a_missing_coolant_supply_reading_gives_no_r_no_incident_and_says_why(tmp_path):
    rack, d = Rack(tmp_path), _detectors(fire=0.0)
    rack.r[2] = CLEAN * 1.3
    rack.supply = None
    events = _run(rack, d, 120)
    out = rack.step()
    assert events == [] and not _values(out, R)
    assert _reasons(out) == {str(i): "no_supply_reading" for i in range(4)}
    unknown = [o for o in d.observe(rack.store.snapshot()) if o.detector == "cold_plate_degraded"]
    assert {o.detail.get("unknown") for o in unknown if "gpu" in dict(o.targets)} == {"no_supply_reading"}
    assert all(o.cond is None for o in unknown)
    # No CDU mapped to the tray at all: the reason says so.
    rack.source = rack._source(None)
    assert _reasons(rack.step()) == {str(i): "no_supply_mapping" for i in range(4)}


def test_the_baseline_survives_a_restart_and_shows_a_whole_tray_fouling_its_peers_cannot(tmp_path):
    rack, d = Rack(tmp_path, learn_seconds=60.0), _detectors(fire=30.0)
    _run(rack, d, 100)
    out = rack.step()
    assert _values(out, BASE) == {str(i): CLEAN for i in range(4)}
    rack.restart()
    saved = json.loads(rack.path.read_text())
    assert sorted(saved["gpus"]) == [f"GPU-{i}" for i in range(4)]
    out = rack.step()  # the first poll of the new process, still settling: the baseline is there already
    assert _values(out, BASE) == {str(i): CLEAN for i in range(4)} and not _values(out, R)
    rack.r = [CLEAN * 1.3] * 4  # every plate of the tray: the same against each other, 30 % up on their own past
    events = _run(rack, d, 90)
    assert [(e.kind, e.targets) for e in events] == [("fire", {"node": "node01"})]
    assert events[0].detail["scope"] == "tray" and sorted(events[0].detail["gpus"]) == ["0", "1", "2", "3"]
    # A fouled plate never becomes its own normal: the baselines stayed where they were learnt.
    assert _values(rack.step(), BASE) == {str(i): CLEAN for i in range(4)}


def test_a_corrupt_baseline_file_is_set_aside_and_learning_starts_afresh(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_text('{"version": 1, "gpus": {"GPU-0": {"3": {"r": -1, "learnt_s": 5, "samples": 1}}}}')
    b = ThermalBaselines(path, 60.0, 5.0)
    assert b.gpus == {} and not path.exists()
    assert (tmp_path / (FILE_NAME + ".corrupt")).exists()


def _trays(flows: dict[str, float | None], t: float):
    from agent.snapshot import Snapshot

    rs = [Reading(RF.SERVICE_INFO, 1.0, {"bmc": b, "kind": "tray", "redfish_version": "1.17.0", "vendor": "",
                                         "model": "", "firmware": "", "profile": "dmtf"}, timestamp=t)
          for b in flows]
    rs += [Reading(RF.CONNECTOR_FLOW, f, {"bmc": b, "equipment": "Chassis/Chassis_0", "connector": "TrayInlet",
                                          "loop": "chassis"}, timestamp=t) for b, f in flows.items() if f is not None]
    return Snapshot(t, tuple(rs), (), monotonic=t)


def test_a_tray_far_below_its_peers_flow_fires_and_a_missing_flow_is_unknown_not_fine():
    d = Detectors(DetectorSettings(tray_flow_low={"fire_seconds": 20.0, "clear_seconds": 20.0}),
                  Context("node01", "r01"))

    def events(flows, t):
        return [(e.kind, e.targets["bmc"]) for e in d.evaluate(_trays(flows, t)) if e.detector == "tray_flow_low"]

    healthy = {"bmc-node01": 3e-5, "bmc-node02": 3.1e-5, "bmc-node03": 2.9e-5}
    assert events(healthy, 0.0) == []
    blocked = dict(healthy, **{"bmc-node02": 1.5e-5})
    assert events(blocked, 10.0) == []
    assert events(blocked, 31.0) == [("fire", "bmc-node02")]
    # Its BMC stops reporting a flow: held (unknown), neither cleared nor fired anew.
    assert events(dict(healthy, **{"bmc-node02": None}), 60.0) == []
    obs = [o for o in d.observe(_trays(dict(healthy, **{"bmc-node02": None}), 61.0)) if o.detector == "tray_flow_low"]
    assert {dict(o.targets)["bmc"]: (o.cond, o.detail.get("unknown")) for o in obs}["bmc-node02"] == \
        (None, "no_flow_reading")
    assert events(healthy, 90.0) == []
    assert events(healthy, 111.0) == [("clear", "bmc-node02")]


def test_the_twins_fouling_and_blocked_tray_follow_the_physics_and_clear_undoes_them(tmp_path):
    """sim: cold-plate-fouling raises one plate's R (its rise over the supply per watt) by the percent, at any
    power; tray-flow-blocked cuts that tray's flow against its peers' and its GPUs run hotter; clear undoes both."""
    import pytest

    from sim.faults import FaultError
    from sim.server import Simulator

    sim = Simulator(nodes=3, gpus=4, devices=False, advertise=False, workdir=tmp_path)
    m = sim.model

    def settle() -> None:
        for _ in range(30):
            m.step(1.0)

    def r(node: str, gpu: int) -> float:
        g = m.gpu(node, gpu)
        return (g.temp_c - m.coolant.secondary_supply_c) / g.power_w

    settle()
    clean = r("node01", 1)
    sim.inject("cold-plate-fouling", {"node": "node01", "gpu": "1", "percent": "30"})
    settle()
    assert r("node01", 1) == pytest.approx(clean * 1.3, rel=1e-3)
    assert r("node01", 0) == pytest.approx(clean, rel=1e-3)
    g = m.gpu("node01", 1)
    assert g.temp_c < g.slowdown_c  # a 30 % fouled plate under load is still below slowdown
    for ratio in (0.85, 0.4):  # the same R at another power: the fault is a resistance, not a fixed offset
        sim.inject("workload", {"node": "node01", "ratio": str(ratio)})
        settle()
        assert r("node01", 1) == pytest.approx(clean * 1.3, rel=1e-3)

    sim.inject("tray-flow-blocked", {"node": "node02", "percent": "60"})
    settle()
    assert m.tray_flow_lpm("node02") == pytest.approx(0.4 * m.tray_flow_lpm("node03"))
    assert m.gpu("node02", 0).temp_c > m.gpu("node03", 0).temp_c + 10
    with pytest.raises(FaultError, match="node"):
        sim.inject("tray-flow-blocked", {"node": "node09"})
    with pytest.raises(FaultError, match="percent"):
        sim.inject("cold-plate-fouling", {"node": "node01", "gpu": "1", "percent": "-5"})

    sim.clear()
    settle()
    assert r("node01", 1) == pytest.approx(clean, rel=1e-3)
    assert m.tray_flow_lpm("node02") == pytest.approx(m.tray_flow_lpm("node03"))


def test_the_supply_of_a_tray_is_its_zones_valve_cdu_else_its_zones_cdu_else_the_racks_valve_cdu_else_the_only():
    from agent.config import Inventory
    from agent.derived_thermal import supply_cdu

    cdu = {"profile": "reference-cdu", "channels": {1: "zone-a", 2: "zone-b"}}
    zones = [{"name": "zone-a", "nodes": ["n1"], "valve": "cdu1:zone_valve_1"}, {"name": "zone-b", "nodes": ["n2"]}]
    inv = Inventory(nodes=["n1", "n2", "n3"], cdus=[{"name": "cdu1", **cdu}, {"name": "rdhx1", **cdu}],
                    leak_zones=zones)
    assert supply_cdu(inv, "n1") == "cdu1"  # both serve zone-a's leak channels: the valve's CDU feeds it
    # zone-b has no valve of its own, and two CDUs serve its channels: the rack's valves all sit on cdu1, the loop
    assert supply_cdu(inv, "n2") == "cdu1"
    assert supply_cdu(inv, "n3") == "cdu1"  # in no zone: the rack's loop too
    two = Inventory(nodes=["n1", "n2"], cdus=[{"name": "cdu1", **cdu}, {"name": "rdhx1", **cdu}],
                    leak_zones=[{"name": "zone-a", "nodes": ["n1"]}, {"name": "zone-b", "nodes": ["n2"]}])
    assert supply_cdu(two, "n2") is None  # two CDUs serve zone-b and no valve anywhere says which: not guessed
    one = Inventory(nodes=["n1"], cdus=[{"name": "cdu7", "profile": "reference-cdu"}])
    assert supply_cdu(one, "n1") == "cdu7"


def test_check_config_names_a_bad_thermal_resistance_or_cold_plate_setting(tmp_path):
    import pytest

    from agent.config import ConfigError, parse_config
    from tests.test_config import minimal

    for section, key, value, named in (
            ("sources", "thermal_resistance", {"min_power_ratio": 1.5}, "sources.thermal_resistance.min_power_ratio"),
            ("sources", "thermal_resistance", {"smoothing_seconds": 0}, "sources.thermal_resistance.smoothing_seconds"),
            ("sources", "thermal_resistance", {"gate": 1}, "sources.thermal_resistance.gate"),
            ("remediation", "detectors", {"cold_plate_degraded_ratio": -0.1},
             "remediation.detectors.cold_plate_degraded_ratio"),
            ("remediation", "detectors", {"tray_flow_low_ratio": 1.2}, "remediation.detectors.tray_flow_low_ratio")):
        with pytest.raises(ConfigError) as exc:
            parse_config(minimal(tmp_path, **{section: {key: value}}), "agent.yaml")
        assert named in str(exc.value), str(exc.value)


def test_a_baseline_file_that_cannot_be_written_is_kept_in_memory_and_tried_again_next_period(tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")  # every write below it fails (ENOTDIR)
    b = ThermalBaselines(blocker / FILE_NAME, learn_seconds=10.0, persist_seconds=30.0)
    for t in range(12):
        b.add("GPU-0", 3, 0.06, 1.0)
    assert not b.save(100.0)  # learnt, due at once, and the write fails: said in the log, nothing raised
    assert b.baseline("GPU-0", 3) == 0.06  # still in memory
    assert b.pending(110.0) is None  # not again before the persist period
    blocker.unlink()
    assert b.save(131.0) and json.loads((blocker / FILE_NAME).read_text())["gpus"]["GPU-0"]["3"]["r"] == 0.06


# -- the rack's reference (issue 35: R judged against the other trays' loaded GPUs) ---------------------------


def _with_rack(rack: Rack, median: float | None, peers: int) -> None:
    """The rack's reference as the tray summaries' share publishes it (agent.coordination.link_share)."""
    from agent.coordination.link_share import DEVICE, GPU_RACK_THERMAL_PEERS, GPU_RACK_THERMAL_RESISTANCE, SOURCE

    rack.store.register(SOURCE, DEVICE, 0.5, 1e9)
    out = [Reading(GPU_RACK_THERMAL_PEERS, float(peers), {}, timestamp=rack.t)]
    if median is not None:
        out.append(Reading(GPU_RACK_THERMAL_RESISTANCE, median, {}, timestamp=rack.t))
    rack.store.publish(SOURCE, DEVICE, out, 0.0)


def _run_with_rack(rack: Rack, d: Detectors, seconds: float, median: float | None, peers: int) -> list:
    events = []
    for _ in range(int(seconds / 5.0)):
        rack.step(5.0)
        _with_rack(rack, median, peers)
        events += [e for e in d.evaluate(rack.store.snapshot()) if e.detector == "cold_plate_degraded"]
    return events


def test_a_fouled_plate_on_a_two_gpu_tray_stands_out_against_the_rack_with_no_tray_median_and_no_history(tmp_path):
    """Two loaded GPUs: one peer on the tray, below cold_plate_min_peers (2): no tray median; no baseline learnt
    yet. Only the rack's reference (the other trays' loaded GPUs) shows the fouled plate."""
    rack = Rack(tmp_path, gpus=2, learn_seconds=1e6)
    d = _detectors(fire=30.0)
    rack.r[1] = CLEAN * 1.3
    assert _run(rack, d, 120.0) == []  # without the rack's reference nothing shows it
    events = _run_with_rack(rack, d, 90.0, CLEAN, 8)
    assert [(e.kind, e.targets) for e in events] == [("fire", {"node": "node01", "gpu": "1"})]
    assert events[0].detail["off"] == ["rack"] and events[0].detail["rack_median_kelvin_per_watt"] == CLEAN
    # Too few loaded GPUs on the other trays: the reference is not used (nothing new fires, nothing clears).
    d2 = _detectors(fire=30.0)
    assert _run_with_rack(rack, d2, 90.0, CLEAN, 1) == []


def test_a_tray_whose_every_plate_fouled_is_one_tray_incident_against_the_rack(tmp_path):
    """Every plate of the tray fouled alike: the tray's median moved with them (peers show nothing), no
    baseline yet; against the rack the tray stands out: one incident for the tray, not one per GPU; it clears
    when the plates are clean again."""
    rack = Rack(tmp_path, gpus=4, learn_seconds=1e6)
    d = _detectors(fire=30.0, clear=30.0)
    _run_with_rack(rack, d, 30.0, CLEAN, 8)
    rack.r = [CLEAN * 1.3] * 4
    events = _run_with_rack(rack, d, 90.0, CLEAN, 8)
    assert [(e.kind, e.targets) for e in events] == [("fire", {"node": "node01"})]
    assert events[0].detail["scope"] == "tray" and events[0].detail["off"] == ["rack"]
    rack.r = [CLEAN] * 4
    assert [(e.kind, e.targets) for e in _run_with_rack(rack, d, 120.0, CLEAN, 8)] == [("clear", {"node": "node01"})]


def test_the_rack_reference_is_the_median_of_the_other_trays_loaded_gpus_on_the_same_loop_and_flow():
    from agent.coordination.tray_cooling import GpuCooling, TrayCooling, rack_resistance

    def tray(cdu: str, flow: float | None, *rs: float | None) -> TrayCooling:
        return TrayCooling(cdu, flow, {str(i): GpuCooling(r, 600.0, 40.0, 200.0) for i, r in enumerate(rs)})

    cooling = {"node01": tray("cdu1", FLOW, 0.09, 0.09),  # every plate of this tray fouled
               "node02": tray("cdu1", FLOW, 0.06, 0.061, None),  # one GPU idle: not counted
               "node03": tray("cdu1", FLOW * 1.02, 0.059),
               "node04": tray("cdu2", FLOW, 0.2),  # another loop
               "node05": tray("cdu1", FLOW * 2, 0.03)}  # another flow band
    got = rack_resistance("node01", cooling, 0.1)
    assert got.median == 0.06 and got.gpus == 3 and got.trays == ("node02", "node03")
    assert rack_resistance("node09", cooling, 0.1).median is None  # a tray that says nothing has no reference


@pytest.mark.parametrize("cool, field", [
    ({"cdu": "cdu1", "flow": 0.005, "g": {"0": [-0.06, 600, 40, 200]}}, "links.cool.g.0.r"),
    ({"cdu": "cdu1", "flow": 0.005, "g": {"0": [float("nan"), 600, 40, 200]}}, "links.cool.g.0.r"),
    ({"cdu": "cdu1", "flow": 0.005, "g": {"0": [0.06, 1e9, 40, 200]}}, "links.cool.g.0.watts"),
    ({"cdu": "cdu1", "flow": 0.005, "g": {"0": [0.06, 600, 40]}}, "links.cool.g.0"),
    ({"cdu": "cdu1", "flow": -1, "g": {}}, "links.cool.flow"),
    ({"cdu": 7, "flow": 0.005, "g": {}}, "links.cool.cdu"),
    ({"cdu": "cdu1", "flow": 0.005, "g": {"x": [0.06, 600, 40, 200]}}, "links.cool.g"),
    ("garbage", "links.cool"),
])
def test_a_peers_garbage_cooling_summary_refuses_its_whole_vector_naming_the_field(cool, field):
    from agent.coordination.link_vectors import decode
    from agent.coordination.records import RecordError

    raw = json.dumps({"v": 1, "node": "node02", "at": 1000.0, "gpus": {}, "cool": cool})
    with pytest.raises(RecordError) as err:
        decode(raw, "node02", ["node01", "node02"], 1000.0, 5.0)
    assert field in err.value.detail
