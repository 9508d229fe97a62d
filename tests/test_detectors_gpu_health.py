"""The GPU health cause detectors and the straggler detector (issue 33) on hand-made snapshots, deterministic clock.

gpu_pcie_degraded (width always, generation under load only), gpu_clock_slowdown (HW Slowdown and HW Power
Brake, a thermal HW Slowdown left to gpu_thermal) and gpu_straggler (band around the node median of busy GPUs,
its hold, idle GPUs ignored, the cause named). The same with the real daemon: tests/test_detectors_gpu_health_agent.py.
"""

from __future__ import annotations

from agent.remediation.detectors import Context, Detectors
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot
from exporters.model import Quality, Reading

from tests.test_detectors import reading

FAST = {"fire_seconds": 0.0, "clear_seconds": 0.0}
MHZ = 1e6


def _gpu(gpu: str, t: float, util: float = 0.9, sm_mhz: float = 1980, watts: float = 600.0,
         width: tuple[int, int] = (16, 16), gen: tuple[int, int] = (5, 5), reasons: tuple[str, ...] = ()) -> list[Reading]:
    """One GPU's readings as the NVML source publishes them (its own label sets)."""
    ids = {"gpu": gpu, "uuid": f"GPU-{gpu}"}
    rs = [reading("supernode_gpu_utilization_ratio", util, t, engine="gpu", **ids),
          reading("supernode_gpu_clock_hertz", sm_mhz * MHZ, t, clock="sm", **ids),
          reading("supernode_gpu_power_watts", watts, t, **ids),
          reading("supernode_gpu_pcie_link_width", width[0], t, kind="current", **ids),
          reading("supernode_gpu_pcie_link_width", width[1], t, kind="max", **ids),
          reading("supernode_gpu_pcie_link_generation", gen[0], t, kind="current", **ids),
          reading("supernode_gpu_pcie_link_generation", gen[1], t, kind="max", **ids)]
    for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"):
        rs.append(reading("supernode_gpu_clock_event_active", 1.0 if reason in reasons else 0.0, t, reason=reason, **ids))
    return rs


def _node(t: float, n: int = 8, **special: dict) -> Snapshot:
    """A node of `n` busy, healthy GPUs at wall and monotonic time t; special={"3": {...}} changes GPU 3."""
    rs: list[Reading] = []
    for i in range(n):
        rs += _gpu(str(i), t, **special.get(str(i), {}))
    return Snapshot(t, tuple(rs), (), monotonic=t)


def _events(d: Detectors, s: Snapshot, detector: str) -> list[tuple[str, dict, dict]]:
    return [(e.kind, e.targets, dict(e.detail)) for e in d.evaluate(s) if e.detector == detector]


def _detectors(**settings) -> Detectors:
    return Detectors(DetectorSettings(**settings), Context("node01", "r01"))


# -- gpu_pcie_degraded -------------------------------------------------------------------


def test_a_link_trained_below_its_max_width_fires_after_its_hold_busy_or_idle():
    d = _detectors(gpu_pcie_degraded={"fire_seconds": 60.0, "clear_seconds": 30.0})
    narrow = {"width": (8, 16), "util": 0.0}  # idle: the width counts all the same
    assert _events(d, _node(0.0, **{"2": narrow}), "gpu_pcie_degraded") == []
    assert _events(d, _node(59.0, **{"2": narrow}), "gpu_pcie_degraded") == []
    [(kind, targets, detail)] = _events(d, _node(60.0, **{"2": narrow}), "gpu_pcie_degraded")
    assert (kind, targets) == ("fire", {"node": "node01", "gpu": "2"})
    assert (detail["width"], detail["max_width"]) == (8, 16)
    # Trained again (a reset): clears after its clear hold.
    assert _events(d, _node(61.0), "gpu_pcie_degraded") == []
    assert [e[0] for e in _events(d, _node(91.0), "gpu_pcie_degraded")] == ["clear"]


def test_a_low_generation_counts_only_under_load():
    """An idle GPU's link at Gen1 is the GPU saving power (H100 and Blackwell do it), not a fault."""
    d = _detectors(gpu_pcie_degraded=FAST)
    idle_gen1 = {"gen": (1, 5), "util": 0.0}
    for t in range(5):
        assert _events(d, _node(float(t), **{"4": idle_gen1}), "gpu_pcie_degraded") == []
    busy_gen3 = {"gen": (3, 5), "util": 0.9}
    [(kind, targets, detail)] = _events(d, _node(5.0, **{"4": busy_gen3}), "gpu_pcie_degraded")
    assert (kind, targets["gpu"], detail["generation"], detail["max_generation"]) == ("fire", "4", 3, 5)
    # Idle again at Gen1: unknown, the incident stays (an idle link says nothing of how it trains under load).
    assert _events(d, _node(6.0, **{"4": idle_gen1}), "gpu_pcie_degraded") == []
    assert [e[0] for e in _events(d, _node(7.0), "gpu_pcie_degraded")] == ["clear"]


# -- gpu_clock_slowdown ------------------------------------------------------------------


def test_hw_slowdown_and_power_brake_fire_after_a_hold_and_name_the_reason():
    d = _detectors(gpu_clock_slowdown={"fire_seconds": 30.0, "clear_seconds": 10.0})
    brake = {"reasons": ("hw_slowdown", "hw_power_brake")}
    for t in (0.0, 10.0, 29.0):
        assert _events(d, _node(t, **{"1": brake}), "gpu_clock_slowdown") == []
    [(kind, targets, detail)] = _events(d, _node(30.0, **{"1": brake}), "gpu_clock_slowdown")
    assert (kind, targets, detail) == ("fire", {"node": "node01", "gpu": "1"},
                                       {"reasons": ["hw_power_brake", "hw_slowdown"]})
    # A blip shorter than the hold never fires.
    d2 = _detectors(gpu_clock_slowdown={"fire_seconds": 30.0, "clear_seconds": 10.0})
    assert _events(d2, _node(0.0, **{"1": {"reasons": ("hw_slowdown",)}}), "gpu_clock_slowdown") == []
    assert _events(d2, _node(5.0), "gpu_clock_slowdown") == []
    assert _events(d2, _node(31.0, **{"1": {"reasons": ("hw_slowdown",)}}), "gpu_clock_slowdown") == []


def test_a_thermal_hw_slowdown_is_gpu_thermals_and_sw_power_cap_is_not_a_slowdown():
    d = _detectors(gpu_clock_slowdown=FAST)
    hot = {"reasons": ("hw_slowdown", "hw_thermal")}
    capped = {"reasons": ("sw_power_cap",)}
    assert _events(d, _node(0.0, **{"0": hot, "5": capped}), "gpu_clock_slowdown") == []
    [(kind, targets, detail)] = _events(d, _node(1.0, **{"0": {"reasons": ("hw_slowdown",)}}), "gpu_clock_slowdown")
    assert (kind, targets["gpu"], detail["reasons"]) == ("fire", "0", ["hw_slowdown"])


# -- gpu_straggler -----------------------------------------------------------------------


def test_a_busy_gpu_below_the_node_median_clock_fires_after_its_hold_unexplained():
    d = _detectors(gpu_straggler={"fire_seconds": 60.0, "clear_seconds": 20.0})
    slow = {"sm_mhz": 1700}  # 14 % below the median of 1980: outside the 10 % band
    for t in (0.0, 30.0, 59.0):
        assert _events(d, _node(t, **{"6": slow}), "gpu_straggler") == []
    [(kind, targets, detail)] = _events(d, _node(60.0, **{"6": slow}), "gpu_straggler")
    assert (kind, targets) == ("fire", {"node": "node01", "gpu": "6"})
    assert detail["cause"] == "unexplained" and detail["off"] == ["sm_clock"]
    assert (detail["sm_clock_hertz"], detail["node_median_sm_clock_hertz"]) == (1700 * MHZ, 1980 * MHZ)
    assert detail["gpus_compared"] == 8
    # Between the clear band (5 %) and the band (10 %): held; back inside: cleared after the clear hold.
    assert _events(d, _node(61.0, **{"6": {"sm_mhz": 1850}}), "gpu_straggler") == []
    assert _events(d, _node(200.0, **{"6": {"sm_mhz": 1850}}), "gpu_straggler") == []
    assert _events(d, _node(201.0, **{"6": {"sm_mhz": 1960}}), "gpu_straggler") == []
    assert [e[0] for e in _events(d, _node(221.0, **{"6": {"sm_mhz": 1960}}), "gpu_straggler")] == ["clear"]


def test_the_band_edges_a_faster_gpu_and_power_off_either_side():
    d = _detectors(gpu_straggler=FAST)
    # 9 % below, or faster than the others: inside the band.
    assert _events(d, _node(0.0, **{"1": {"sm_mhz": 1802}, "2": {"sm_mhz": 2400}}), "gpu_straggler") == []
    # Power 25 % above the median (band 20 %), and another 25 % below: both fire, named by power.
    fired = _events(d, _node(1.0, **{"1": {"watts": 750.0}, "2": {"watts": 450.0}}), "gpu_straggler")
    assert sorted((t["gpu"], det["off"]) for _, t, det in fired) == [("1", ["power"]), ("2", ["power"])]


def test_gpus_not_under_load_are_neither_compared_nor_stragglers():
    d = _detectors(gpu_straggler=FAST)
    # Five idle GPUs at a low clock: the median is the three busy ones', and none of the idle fires.
    idle = {"util": 0.1, "sm_mhz": 345, "watts": 90.0}
    special = {str(i): idle for i in range(3, 8)}
    assert _events(d, _node(0.0, **special), "gpu_straggler") == []
    # Two busy GPUs are too few for a median (gpu_straggler_min_gpus 3): a slow one of them is not judged.
    special["2"] = {"util": 0.1}
    assert _events(d, _node(1.0, **{**special, "0": {"sm_mhz": 1000}}), "gpu_straggler") == []
    # Three busy: judged against them.
    del special["2"]
    [(kind, targets, _)] = _events(d, _node(2.0, **{**special, "0": {"sm_mhz": 1000}}), "gpu_straggler")
    assert (kind, targets["gpu"]) == ("fire", "0")
    # The straggler's job ends (it goes idle): no longer a straggler.
    special["0"] = idle
    assert [e[0] for e in _events(d, _node(3.0, **special), "gpu_straggler")] == ["clear"]


def test_the_straggler_names_each_cause_that_explains_it():
    cases = {
        "pcie_degraded": {"width": (4, 16)},
        "clock_slowdown": {"reasons": ("hw_slowdown", "hw_power_brake")},
        "thermal": {"reasons": ("hw_slowdown", "hw_thermal")},
        "power_cap": {"reasons": ("sw_power_cap",)},
        "pcie_degraded,clock_slowdown": {"gen": (2, 5), "reasons": ("hw_slowdown",)},
    }
    for cause, fault in cases.items():
        d = _detectors(gpu_straggler=FAST)
        [(kind, _, detail)] = _events(d, _node(0.0, **{"3": {"sm_mhz": 990, **fault}}), "gpu_straggler")
        assert (kind, detail["cause"]) == ("fire", cause), cause


def test_the_straggler_names_thermal_while_gpu_thermal_holds_its_incident():
    """gpu_thermal's incident open (the GPU near slowdown, capped) explains a slow GPU with no clock event now."""
    d = _detectors(gpu_straggler={"fire_seconds": 10.0, "clear_seconds": 0.0}, gpu_thermal=FAST)

    def with_temp(t: float, celsius: float) -> Snapshot:
        s = _node(t, **{"3": {"sm_mhz": 990}})
        extra = (reading("supernode_gpu_temperature_celsius", celsius, t, gpu="3", uuid="GPU-3", sensor="gpu"),
                 reading("supernode_gpu_temperature_threshold_celsius", 87.0, t, gpu="3", uuid="GPU-3",
                         threshold="slowdown"))
        return Snapshot(t, s.readings + extra, (), monotonic=t)

    assert [e.detector for e in d.evaluate(with_temp(0.0, 86.0))] == ["gpu_thermal"]
    fired = [e for e in d.evaluate(with_temp(10.0, 86.0)) if e.detector == "gpu_straggler"]
    assert [(e.kind, e.detail["cause"]) for e in fired] == [("fire", "thermal")]


def test_each_node_of_a_snapshot_is_its_own_median():
    """A snapshot holding another node's GPUs (the rack leader's view): a node's GPUs compare among themselves."""
    d = _detectors(gpu_straggler=FAST)
    rs: list[Reading] = []
    for node, mhz in (("node01", 1980), ("node02", 1500)):
        for i in range(4):
            rs += [Reading(r.spec, r.value, {**r.labels, "node": node}, r.quality, r.timestamp)
                   for r in _gpu(str(i), 0.0, sm_mhz=mhz)]
    assert _events(d, Snapshot(0.0, tuple(rs), (), monotonic=0.0), "gpu_straggler") == []


def _with_rack(s: Snapshot, mhz: float | None, quality: Quality = Quality.OK) -> Snapshot:
    """The snapshot plus the rack's reference clock as agent.coordination.link_share publishes it."""
    if mhz is None:
        return s
    from agent.coordination.link_share import GPU_RACK_MEDIAN_SM_CLOCK

    rack = Reading(GPU_RACK_MEDIAN_SM_CLOCK, mhz * MHZ, {}, quality, s.taken_at)
    return Snapshot(s.taken_at, s.readings + (rack,), (), monotonic=s.monotonic)


def test_a_whole_tray_below_the_racks_median_clock_is_a_straggler_its_own_median_never_shows():
    d = _detectors(gpu_straggler={"fire_seconds": 10.0, "clear_seconds": 10.0})
    slow = {str(i): {"sm_mhz": 1600} for i in range(8)}  # every GPU of the tray alike: its own median is 1600
    # Without the rack's reference (no NVLink attribution, or fewer than 3 busy trays): nothing to see.
    assert _events(d, _node(0.0, **slow), "gpu_straggler") == []
    assert _events(d, _node(20.0, **slow), "gpu_straggler") == []
    d = _detectors(gpu_straggler={"fire_seconds": 10.0, "clear_seconds": 10.0})
    assert _events(d, _with_rack(_node(0.0, **slow), 1980), "gpu_straggler") == []
    fired = _events(d, _with_rack(_node(10.0, **slow), 1980), "gpu_straggler")
    assert sorted(t["gpu"] for _, t, _ in fired) == [str(i) for i in range(8)]
    for kind, _, detail in fired:
        assert (kind, detail["off"], detail["cause"]) == ("fire", ["sm_clock_vs_rack"], "unexplained")
        assert (detail["rack_median_sm_clock_hertz"], detail["node_median_sm_clock_hertz"]) == (1980 * MHZ, 1600 * MHZ)
    # The rack's reference goes stale (coordination lost): held, not cleared on a reference it does not have,
    # however long (the clear hold is 10 s)...
    for t in (15.0, 30.0, 60.0):
        assert _events(d, _with_rack(_node(t, **slow), 1980, Quality.STALE), "gpu_straggler") == []
    # ...and once the reference is back with the tray at the rack's pace (within the clear band of 5 %),
    # cleared after the hold.
    assert _events(d, _with_rack(_node(70.0), 1980), "gpu_straggler") == []
    assert sorted(e[0] for e in _events(d, _with_rack(_node(80.0), 1980), "gpu_straggler")) == ["clear"] * 8


def test_a_tray_faster_than_the_rack_is_no_straggler_and_one_busy_gpu_is_judged_against_the_rack():
    d = _detectors(gpu_straggler=FAST)
    assert _events(d, _with_rack(_node(0.0, **{str(i): {"sm_mhz": 2100} for i in range(8)}), 1980),
                   "gpu_straggler") == []
    # One busy GPU (too few for its node's median) at 1500 MHz against a rack at 1980: fires on the rack alone.
    idle = {str(i): {"util": 0.1, "sm_mhz": 345} for i in range(1, 8)}
    [(kind, targets, detail)] = _events(d, _with_rack(_node(1.0, **{"0": {"sm_mhz": 1500}, **idle}), 1980),
                                         "gpu_straggler")
    assert (kind, targets["gpu"], detail["off"]) == ("fire", "0", ["sm_clock_vs_rack"])
    assert detail["node_median_sm_clock_hertz"] is None
