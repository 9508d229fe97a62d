"""Issue 34: switch-side vs tray-side NVLink attribution on published link vectors (the wire format each agent
puts under links/<node>), and what the local detectors do with the verdict. Pure: no agent, no etcd."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from agent.coordination.attribution import attribute, switch_tray_of, threshold_for
from agent.coordination.link_share import NVLINK_SWITCH_FAULT
from agent.coordination.link_vectors import LinkVector, decode, encode
from agent.coordination.records import RecordError
from agent.remediation.detectors import Context, Detectors
from agent.remediation.settings import DetectorSettings
from exporters.gpu import nvml_metrics
from exporters.model import Quality, Reading
from agent.snapshot import Snapshot

NOW = 1_800_000_000.0
RACK18 = [f"node{i:02d}" for i in range(1, 19)]
SWITCH_TRAYS = [{"name": f"switch{j + 1:02d}", "chips": [2 * j, 2 * j + 1]} for j in range(9)]


def published(node: str, down: dict[int, str] | None = None, at: float = NOW, gpus: int = 4) -> bytes:
    """The bytes a GB200 tray's agent puts: 4 GPUs x 18 links, `down` = {gpu: link states overriding 'u'}."""
    links = {str(g): "u" * 18 for g in range(gpus)}
    for g, states in (down or {}).items():
        links[str(g)] = states
    return json.dumps({"v": 1, "node": node, "at": at, "gpus": links}).encode()


def link(k: int, state: str = "d") -> str:
    return "u" * k + state + "u" * (17 - k)


def vectors(raw: dict[str, bytes], nodes=RACK18) -> dict[str, LinkVector]:
    return {n: decode(b, n, nodes, NOW, 5.0) for n, b in raw.items()}


def verdict(raw: dict[str, bytes], nodes=RACK18, min_trays: int = 3, max_age: float = 15.0):
    return attribute(vectors(raw, nodes), nodes, NOW, min_trays, max_age)


def test_one_chip_down_on_every_tray_is_switch_side_and_no_tray_keeps_it():
    raw = {n: published(n, {g: link(5) for g in range(4)}) for n in RACK18}
    a = verdict(raw)
    assert a.switch_chips == (5,) and a.trays_by_chip[5] == tuple(RACK18)
    assert a.tray_side == () and a.counted == tuple(RACK18) and a.stale == a.silent == ()
    assert switch_tray_of(5, SWITCH_TRAYS) == "switch03" and switch_tray_of(5, []) == ""


def test_one_trays_link_is_tray_side():
    raw = {n: published(n) for n in RACK18} | {"node07": published("node07", {2: link(11)})}
    a = verdict(raw)
    assert a.switch_chips == () and a.tray_side == (("node07", "2", 11),)


def test_exactly_the_threshold_is_switch_side_one_fewer_is_not_and_order_never_matters():
    """Ties: >= N counts; every qualifying chip is named; the verdict is the same whatever order vectors come in."""
    three = {n: published(n, {0: link(7)}) for n in RACK18[:3]}
    two_of_chip_9 = {n: published(n, {1: link(9, "e")}) for n in RACK18[3:5]}  # erroring counts as failing
    raw = {n: published(n) for n in RACK18} | three | two_of_chip_9
    a = verdict(raw)
    assert a.switch_chips == (7,) and a.trays_by_chip[7] == tuple(RACK18[:3])
    assert a.tray_side == (("node04", "1", 9), ("node05", "1", 9))
    for order in itertools.islice(itertools.permutations(sorted(raw)), 0, 50, 7):
        assert verdict({n: raw[n] for n in order}) == a


def test_a_tray_with_a_switch_side_link_keeps_its_own_failing_link_tray_side():
    raw = {n: published(n, {0: link(4)}) for n in RACK18}
    raw["node02"] = published("node02", {0: link(4), 3: link(12)})
    a = verdict(raw)
    assert a.switch_chips == (4,) and a.tray_side == (("node02", "3", 12),)


def test_a_tray_that_stops_publishing_is_silent_and_counts_for_nothing():
    """A 3-tray rack (N=3): chip 5 down seen by two trays while the third's key went with its lease is not proven
    switch-side: each tray's own detector judges (as without attribution)."""
    nodes = RACK18[:3]
    raw = {n: published(n, {0: link(5)}) for n in nodes[:2]}
    a = verdict(raw, nodes)
    assert a.threshold == 3 and a.switch_chips == () and a.silent == ("node03",)
    assert a.tray_side == (("node01", "0", 5), ("node02", "0", 5))
    raw["node03"] = published("node03", {0: link(5)})
    assert verdict(raw, nodes).switch_chips == (5,)


def test_a_stale_vector_neither_proves_a_switch_fault_nor_is_judged():
    nodes = RACK18[:3]
    raw = {n: published(n, {0: link(5)}) for n in nodes[:2]} | {"node03": published("node03", {0: link(5)},
                                                                                    at=NOW - 16.0)}
    a = verdict(raw, nodes)
    assert a.stale == ("node03",) and a.counted == ("node01", "node02") and a.switch_chips == ()
    assert all(node != "node03" for node, _, _ in a.tray_side)


def test_a_rack_of_fewer_trays_than_n_uses_its_own_size_never_below_two():
    nodes = RACK18[:2]
    raw = {n: published(n, {3: link(17)}) for n in nodes}
    assert verdict(raw, nodes, min_trays=3).switch_chips == (17,)
    assert threshold_for(3, 2) == 2 and threshold_for(3, 1) == 2 and threshold_for(3, 18) == 3
    assert verdict({"node01": published("node01", {0: link(1)})}, RACK18[:1]).switch_chips == ()


@pytest.mark.parametrize("doc,why", [
    ({"v": 1, "node": "node02", "at": NOW, "gpus": {}}, "mismatch"),  # filed under node01's key
    ({"v": 1, "node": "node01", "at": NOW + 60, "gpus": {}}, "future"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {"0": "uux"}}, "type"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {"zero": "uu"}}, "type"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {str(i): "u" for i in range(17)}}, "type"),
    ({"v": 2, "node": "node01", "at": NOW, "gpus": {}}, "version"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": {"n": -1, "sm": 1e9, "w": 500}}, "type"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": {"n": True, "sm": 1e9, "w": 500}}, "type"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": {"n": 4, "sm": 1e12, "w": 500}}, "range"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": {"n": 4, "sm": "fast", "w": 500}}, "range"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": {"n": 4, "sm": 1e9, "w": -5}}, "range"),
    ({"v": 1, "node": "node01", "at": NOW, "gpus": {}, "load": [4]}, "type"),
])
def test_a_vector_that_is_not_a_trays_own_is_rejected_naming_why(doc, why):
    with pytest.raises(RecordError) as err:
        decode(json.dumps(doc), "node01", RACK18, NOW, 5.0)
    assert err.value.why == why
    with pytest.raises(RecordError, match="unknown_node"):
        decode(published("node99"), "node99", RACK18, NOW, 5.0)
    v = LinkVector("node01", NOW, {"0": link(3)})
    assert decode(encode(v), "node01", RACK18, NOW, 5.0) == v


# -- the detectors' side of the verdict ------------------------------------------------------------------------

FAST = {"fire_seconds": 0.0, "clear_seconds": 0.0}
UP = {m.name: m for m in nvml_metrics.ALL}["supernode_nvlink_up"]


def _snap(t: float, down: set[str], switch: set[str]) -> Snapshot:
    rs = [Reading(UP, 0.0 if str(k) in down else 1.0, {"gpu": "0", "uuid": "u0", "link": str(k)}, Quality.OK, t)
          for k in range(18)]
    rs += [Reading(NVLINK_SWITCH_FAULT, 1.0 if str(k) in switch else 0.0,
                   {"switch_chip": str(k), "switch_tray": switch_tray_of(k, SWITCH_TRAYS)}, Quality.OK, t)
           for k in range(18)]
    return Snapshot(t, tuple(rs), (), monotonic=t)


def _events(d: Detectors, s: Snapshot) -> list[tuple[str, str, dict]]:
    return [(e.kind, e.detector, e.targets) for e in d.evaluate(s)]


def test_a_switch_side_link_never_fires_nvlink_errors_and_the_leader_alone_opens_the_switch_fault():
    leads = {"now": False}
    s = DetectorSettings(nvlink_errors=FAST, nvlink_switch_fault=FAST)
    follower = Detectors(s, Context("node01", "r01", leads=lambda: leads["now"]))
    assert _events(follower, _snap(time.time(), {"5"}, {"5"})) == []  # neither drained nor told: not its to tell
    leader = Detectors(s, Context("node02", "r01"))
    assert _events(leader, _snap(time.time(), {"5"}, {"5"})) == [
        ("fire", "nvlink_switch_fault", {"switch_chip": "5", "switch_tray": "switch03"})]
    # The tray's own link (not switch-side) still fires its nvlink_errors, the switch-side one stays out of it.
    ev = follower.evaluate(_snap(time.time() + 1, {"5", "9"}, {"5"}))
    assert [(e.kind, e.detector, e.detail["links_down"], e.detail["links_switch_side"]) for e in ev] == [
        ("fire", "nvlink_errors", ["9"], ["5"])]


def test_drain_partition_counts_switch_side_links_so_every_tray_drains_itself():
    s = DetectorSettings(nvlink_errors=FAST, nvlink_switch_fault=FAST, nvlink_switch_fault_drain_partition=True)
    d = Detectors(s, Context("node01", "r01", leads=lambda: False))
    assert _events(d, _snap(time.time(), {"5"}, {"5"})) == [("fire", "nvlink_errors", {"node": "node01", "gpu": "0"})]


def test_a_verdict_that_stops_coming_ages_out_and_the_tray_judges_all_its_links_again():
    """Coordination lost: the agent stops publishing its verdict; in the store it goes stale within seconds, and
    the tray's nvlink_errors counts the link it had left to the switch (as without attribution)."""
    from agent.coordination.link_share import LinkShare
    from agent.snapshot import SnapshotStore

    clock = {"t": NOW}
    store = SnapshotStore(clock=lambda: clock["t"])
    s = DetectorSettings(nvlink_errors=FAST, nvlink_switch_fault=FAST)
    share = LinkShare("node01", RACK18, s, 5.0, SWITCH_TRAYS, 18, clock=lambda: clock["t"])
    share.attach(store, 3.0)
    share.vectors = vectors({n: published(n, {0: link(5)}) for n in RACK18})
    assert share.publish().switch_chips == (5,)
    d = Detectors(s, Context("node01", "r01", leads=lambda: False))

    def nvlink_errors() -> list:
        snap = store.snapshot()
        own = _snap(clock["t"], {"5"}, set()).readings[:18]  # this tray's link 5 down, fresh
        ev = d.evaluate(Snapshot(snap.taken_at, snap.readings + own, (), monotonic=clock["t"]))
        return [(e.kind, e.detail["links_down"], e.detail["links_switch_side"]) for e in ev
                if e.detector == "nvlink_errors"]

    assert nvlink_errors() == []  # the rack calls link 5 the switch's
    clock["t"] += 2.5  # no publish since: still within the verdict's freshness (6 intervals of 0.5 s)
    assert nvlink_errors() == []
    clock["t"] += 1.0  # 3.5 s without a verdict: it is stale, and the tray judges its links alone again
    assert nvlink_errors() == [("fire", ["5"], [])]


def test_the_trays_own_vector_says_down_erroring_or_up_per_link_by_the_detectors_thresholds():
    from agent.coordination.link_vectors import VectorBuilder

    ber = {m.name: m for m in nvml_metrics.ALL}["supernode_nvlink_bit_error_rate"]
    t = time.time()
    s = _snap(t, {"2"}, set())
    rs = s.readings + (Reading(ber, 3e-12, {"gpu": "0", "uuid": "u0", "link": "4", "kind": "effective"}, Quality.OK, t),
                       Reading(ber, 1e-13, {"gpu": "0", "uuid": "u0", "link": "6", "kind": "effective"}, Quality.OK, t))
    v = VectorBuilder("node01", DetectorSettings()).build(Snapshot(t, rs, (), monotonic=t), t)
    assert v is not None and v.node == "node01" and v.gpus == {"0": "uudueu" + "u" * 12}
    assert v.failing() == [("0", 2), ("0", 4)]


# -- the trays' load summaries and the rack's median busy GPU (gpu_straggler's rack reference) ------------------


def loaded(node: str, busy: int, mhz: float | None, at: float = NOW) -> bytes:
    return json.dumps({"v": 1, "node": node, "at": at, "gpus": {"0": "u" * 18},
                       "load": {"n": busy, "sm": None if mhz is None else mhz * 1e6, "w": 900.0}}).encode()


def test_the_racks_median_is_the_median_of_busy_trays_medians_from_fresh_vectors_only():
    from agent.coordination.rack_load import rack_load

    raw = {"node01": loaded("node01", 4, 1980), "node02": loaded("node02", 4, 1950),
           "node03": loaded("node03", 2, 1500), "node04": loaded("node04", 0, None),  # idle: not counted
           "node05": loaded("node05", 4, 1000, at=NOW - 60),  # stale: says nothing of now
           "node06": published("node06")}  # an agent that sends no load summary (an older one)
    r = rack_load(vectors(raw), NOW, max_age=15.0)
    assert (r.sm_clock_hertz, r.trays) == (1950e6, ("node01", "node02", "node03"))
    # With fewer than 3 busy trays, no reference at all (one slow tray would be half of it).
    del raw["node03"]
    assert rack_load(vectors(raw), NOW, max_age=15.0).sm_clock_hertz is None
    # Each tray weighs one: a tray's busy GPU count does not pull the median.
    raw = {f"node{i:02d}": loaded(f"node{i:02d}", n, mhz) for i, (n, mhz) in
           enumerate([(16, 1000), (1, 1900), (1, 1950)], 1)}
    assert rack_load(vectors(raw), NOW, max_age=15.0).sm_clock_hertz == 1900e6


def test_the_trays_load_summary_is_its_busy_gpus_medians_and_round_trips():
    from agent.coordination.link_vectors import TrayLoad, VectorBuilder
    from tests.test_detectors_gpu_health import _gpu

    t = time.time()
    rs = _snap(t, set(), set()).readings
    for gpu, util, mhz, watts in (("0", 0.9, 1980, 700.0), ("1", 0.95, 1900, 680.0), ("2", 0.1, 345, 90.0)):
        rs += tuple(_gpu(gpu, t, util=util, sm_mhz=mhz, watts=watts))
    v = VectorBuilder("node01", DetectorSettings()).build(Snapshot(t, rs, (), monotonic=t), t)
    assert v is not None and v.load == TrayLoad(2, 1940e6, 690.0)
    assert decode(encode(v), "node01", RACK18, t, 5.0) == v


def test_an_unchanged_verdict_is_vouched_fresh_and_republished_only_every_few_seconds_or_on_a_leadership_change():
    """Issue 38: the coordination loop asks for the verdict every second; the same verdict again only refreshes
    its store entry (no detector runs on it), a changed one is published at once, and an unchanged one at least
    every REPUBLISH_SECONDS (a clear hold needs evaluations to run out) or when this agent's leadership changed."""
    from agent.coordination.link_share import REPUBLISH_SECONDS, LinkShare
    from agent.snapshot import SnapshotStore

    clock = {"t": NOW}
    store = SnapshotStore(clock=lambda: clock["t"])
    outs: list[float] = []
    store.add_listener(lambda snap, origin: outs.append(clock["t"]) if origin == "nvlink_attribution/rack"
                       else None)
    s = DetectorSettings(nvlink_errors=FAST, nvlink_switch_fault=FAST)
    share = LinkShare("node01", RACK18, s, 5.0, SWITCH_TRAYS, 18, clock=lambda: clock["t"])
    share.attach(store, 3.0)
    share.vectors = vectors({n: published(n, {0: link(5)}) for n in RACK18})
    share.publish()
    clock["t"] += 1.0
    share.publish()
    assert len(outs) == 1  # the same verdict: vouched for ...
    assert store.snapshot().source_up("nvlink_attribution", "rack")  # ... and fresh
    share.publish(force=True)  # this agent became (or stopped being) the leader
    assert len(outs) == 2
    clock["t"] += REPUBLISH_SECONDS
    share.publish()
    assert len(outs) == 3  # republished: a hold in progress counts on
    share.vectors = vectors({n: published(n, {}) for n in RACK18})  # the chip is back
    clock["t"] += 0.1
    assert share.publish().switch_chips == ()
    assert len(outs) == 4  # a new verdict at once
