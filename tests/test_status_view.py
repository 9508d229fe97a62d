"""The status page's judgement, on hand-made snapshots: leak zones, GPU marks and NVLink cells, step states, sources."""

from __future__ import annotations

from types import SimpleNamespace

from agent.config import Inventory
from agent.remediation.engine import action_id
from agent.remediation.playbooks import load_playbooks
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot, SourceState
from agent.status.view import ViewBuilder, coordination, nvlink_attribution, nvlink_domain, sources, step_states
from exporters.cooling import modbus_metrics as mm
from exporters.gpu import nvml_metrics as nm
from exporters.model import Quality, Reading

INV = Inventory(nodes=["node01"], gpus={"count": 2, "nvlinks_per_gpu": 4},
                cdus=[{"name": "cdu1", "profile": "reference-cdu", "channels": {1: "zone-a", 2: "zone-b"}}],
                leak_zones=[{"name": n, "nodes": ["node01"], "valve": f"cdu1:zone_valve_{i}"}
                            for i, n in enumerate(("zone-a", "zone-b", "zone-c", "zone-d"), 1)])


def r(spec, value, quality=Quality.OK, **labels) -> Reading:
    return Reading(spec, value, labels, quality, 1.0)


def snap(*readings: Reading, at: float = 10.0) -> Snapshot:
    return Snapshot(at, tuple(readings), ())


def test_a_pdu_outlet_not_read_is_not_counted_as_on():
    """The power card says "all on" only when every watched outlet was read on: an outlet the PDU's last poll did
    not give (its source down: no fresh reading at all) is listed as not read, never as on."""
    from exporters.power import pdu_metrics as pm

    inv = Inventory(nodes=["node01", "node02"], pdus=[{"name": "pdu-a", "profile": "auto",
                                                        "outlets": {"1": "node01", "2": "node02"}}])
    b = ViewBuilder()
    both = b.power(snap(r(pm.OUTLET_ON, 1, pdu="pdu-a", outlet="1"), r(pm.OUTLET_ON, 1, pdu="pdu-a", outlet="2")), inv)
    assert (both["pdus"][0]["outlets_off"], both["pdus"][0]["outlets_unread"]) == ([], [])
    one = b.power(snap(r(pm.OUTLET_ON, 0, pdu="pdu-a", outlet="1")), inv)["pdus"][0]
    assert one["outlets_off"] == [{"outlet": "1", "feeds": "node01"}]
    assert one["outlets_unread"] == [{"outlet": "2", "feeds": "node02"}]
    nothing = b.power(snap(), inv)["pdus"][0]
    assert nothing["outlets_off"] == [] and [o["outlet"] for o in nothing["outlets_unread"]] == ["1", "2"]


def test_each_zone_is_wet_dry_sensor_fault_or_unknown_with_its_valve():
    s = snap(r(mm.LEAK_DETECTED, 1, zone="zone-a", sensor="rope1"),
             r(mm.LEAK_FAULT, 1, zone="zone-a", sensor="rope1", fault="cable_break"),   # wet wins over a fault
             r(mm.LEAK_DETECTED, 0, zone="zone-b", sensor="spot1"),
             r(mm.LEAK_FAULT, 1, zone="zone-b", sensor="spot1", fault="cable_break"),
             r(mm.LEAK_DETECTED, 0, zone="zone-c", sensor="spot2"),
             r(mm.LEAK_FAULT, 1, zone="zone-c", sensor="spot2", fault="source_down"),
             r(mm.LEAK_DETECTED, 0, zone="zone-d", sensor="spot3"),
             r(mm.VALVE_OPEN, 0, cdu="cdu1", zone="zone-a"), r(mm.VALVE_OPEN, 1, cdu="cdu1", zone="zone-b"))
    zones = {z["name"]: z for z in ViewBuilder().coolant(s, INV)["zones"]}
    assert {n: z["state"] for n, z in zones.items()} == {"zone-a": "wet", "zone-b": "fault", "zone-c": "unknown",
                                                         "zone-d": "dry"}
    assert zones["zone-a"]["valve"] == {"ref": "cdu1:zone_valve_1", "state": "closed"}
    assert zones["zone-b"]["valve"]["state"] == "open" and zones["zone-d"]["valve"]["state"] == "unknown"
    assert zones["zone-b"]["sensors"] == [{"sensor": "spot1", "state": "fault", "faults": ["cable_break"]}]
    # a zone with no reading at all is unknown, never dry
    assert {z["name"]: z["state"] for z in ViewBuilder().coolant(snap(), INV)["zones"]}["zone-a"] == "unknown"


def _gpu(g: str, *, up=1.0, hung=0.0, xid=0.0, enforced=1200.0, links=(1, 1, 1, 1), ber=0.0, errors=0.0):
    rs = [r(nm.GPU_UP, up, gpu=g, uuid=g), r(nm.GPU_HUNG, hung, gpu=g, uuid=g), r(nm.LAST_XID, xid, gpu=g, uuid=g),
          r(nm.POWER_LIMIT, 1200, gpu=g, uuid=g, limit="default"), r(nm.POWER_LIMIT, enforced, gpu=g, uuid=g, limit="enforced"),
          r(nm.TEMPERATURE, 60, gpu=g, uuid=g, sensor="gpu"), r(nm.POWER, 900, gpu=g, uuid=g)]
    for link, on in enumerate(links):
        rs.append(r(nm.NVLINK_UP, on, gpu=g, uuid=g, link=str(link)))
    rs.append(r(nm.NVLINK_BER, ber, gpu=g, uuid=g, link="1", kind="effective"))
    rs.append(r(nm.NVLINK_ERRORS, errors, gpu=g, uuid=g, link="2", type="crc_flit"))
    return rs


def test_gpu_cards_show_each_cold_plates_r_against_its_baseline_or_why_it_is_missing():
    from agent.derived_thermal import BASELINE, RESISTANCE, UNAVAILABLE

    s = snap(*_gpu("0"), *_gpu("1"), r(RESISTANCE, 0.0781, gpu="0", uuid="0"), r(BASELINE, 0.0601, gpu="0", uuid="0"),
             r(UNAVAILABLE, 0, gpu="0", uuid="0", reason="below_load_gate"),
             r(UNAVAILABLE, 1, gpu="1", uuid="1", reason="no_supply_reading"),
             r(UNAVAILABLE, 0, gpu="1", uuid="1", reason="below_load_gate"))
    g0, g1 = ViewBuilder().node_card(s, INV, "node01", DetectorSettings(), {"rack": "r01", "node": "node01"})["gpus"]
    assert (g0["thermal_resistance"], g0["thermal_resistance_baseline"], g0["thermal_resistance_unavailable"]) == \
        (0.0781, 0.0601, None)
    assert g0["thermal_resistance_over_baseline"] == 0.3 and g0["thermal_resistance_degraded"]  # > 0.15 (default)
    assert (g1["thermal_resistance"], g1["thermal_resistance_unavailable"]) == (None, "no_supply_reading")
    assert not g1["thermal_resistance_degraded"]
    lax = DetectorSettings(cold_plate_degraded_ratio=0.5)  # the page judges by the detector's own setting
    g0, _ = ViewBuilder().node_card(s, INV, "node01", lax, {"rack": "r01", "node": "node01"})["gpus"]
    assert not g0["thermal_resistance_degraded"]


def test_gpu_cards_say_capped_hung_lost_xid_and_each_links_state():
    b = ViewBuilder()
    ident = {"rack": "r01", "node": "node01"}
    first = snap(*_gpu("0", enforced=200, links=(1, 0, 1, 1)), *_gpu("1", hung=1, up=0, xid=79), at=10.0)
    card = b.node_card(first, INV, "node01", DetectorSettings(), ident)
    g0, g1 = card["gpus"]
    assert g0["capped"] and g0["limit_watts"] == 200 and g0["default_limit_watts"] == 1200
    assert g0["nvlink"] == ["ok", "down", "ok", "ok"] and g0["marks"] == []
    assert not g1["capped"] and g1["marks"] == ["hung", "XID 79 (reboot)"]
    # BER above the threshold, and an error counter seen rising between two views
    later = snap(*_gpu("0", ber=1e-9, errors=5), *_gpu("1", up=0), at=20.0)
    b.node_card(snap(*_gpu("0"), *_gpu("1", up=0), at=15.0), INV, "node01", DetectorSettings(), ident)
    g0, g1 = b.node_card(later, INV, "node01", DetectorSettings(), ident)["gpus"]
    assert g0["nvlink"] == ["ok", "ber", "errors", "ok"]
    assert g1["marks"] == ["lost"]
    # fewer GPUs than the inventory says, NVML answering: the exporter gives the index it no longer enumerates
    # supernode_gpu_up 0 with an empty uuid, and the card says missing (not lost: it was not seen to fall off)
    card = ViewBuilder().node_card(snap(*_gpu("0"), r(nm.GPU_UP, 0.0, gpu="1", uuid="")), INV, "node01",
                                   DetectorSettings(), ident)
    assert [(g["index"], g["marks"]) for g in card["gpus"]] == [("0", []), ("1", ["missing"])]


def test_a_gpu_nvml_said_nothing_of_is_not_read_never_missing():
    """No fresh reading of a GPU at all (the NVML source failing or stale, or not polled yet) is not knowing: the
    card lists the inventory's GPUs by index, marked "not read", where it used to say they were missing."""
    ident = {"rack": "r01", "node": "node01"}
    nothing = ViewBuilder().node_card(snap(), INV, "node01", DetectorSettings(), ident)
    assert [(g["index"], g["marks"]) for g in nothing["gpus"]] == [("0", ["not read"]), ("1", ["not read"])]
    one = ViewBuilder().node_card(snap(*_gpu("1")), INV, "node01", DetectorSettings(), ident)
    assert [(g["index"], g["marks"]) for g in one["gpus"]] == [("0", ["not read"]), ("1", [])]


def _row(kind, aid, target, result=None, **detail):
    return SimpleNamespace(kind=kind, action_id=aid, target=target, result=result, detail=detail)


def test_each_step_says_done_running_blocked_or_waiting_for_approval():
    book = next(b for b in load_playbooks() if b.name == "leak-response")
    steps = list(book.steps)
    idx = {s.action: i for i, s in enumerate(steps)}
    iid = "leak-1"
    drain = action_id(iid, idx["drain"], "node=node01")
    valve = action_id(iid, idx["cdu_write"], "cdu=cdu1,point=zone_valve_1")
    cap0 = action_id(iid, idx["gpu_power_cap"], "gpu=0,node=node01")
    cap1 = action_id(iid, idx["gpu_power_cap"], "gpu=1,node=node01")
    rows = [_row("intent", drain, "node=node01"), _row("result", drain, "node=node01", "done", message="drained"),
            _row("approval", valve, "cdu=cdu1,point=zone_valve_1", "pending", approval="cdu_write_valve"),
            _row("intent", cap0, "gpu=0,node=node01"),
            _row("blocked", cap1, "gpu=1,node=node01", "blocked", guardrail="cooldown", why="cooldown 60 s"),
            _row("result", "not-ours", "node=node09", "done")]
    out = {s["action"]: s for s in step_states(iid, steps, rows, {valve})}
    assert [(t["target"], t["state"]) for t in out["drain"]["targets"]] == [("node=node01", "done")]
    assert out["cdu_write"]["targets"][0]["state"] == "waiting_approval"
    assert out["cdu_write"]["targets"][0]["approval"] == "cdu_write_valve"
    caps = {t["target"]: t for t in out["gpu_power_cap"]["targets"]}
    assert caps["gpu=0,node=node01"]["state"] == "running"
    assert caps["gpu=1,node=node01"]["state"] == "blocked" and caps["gpu=1,node=node01"]["guardrail"] == "cooldown"
    # the approval answered: no longer shown as waiting even before the next row lands
    out = {s["action"]: s for s in step_states(iid, steps, rows, set())}
    assert out["cdu_write"]["targets"] == []


def test_each_source_is_up_stale_failing_or_waiting():
    def st(name, **kw) -> SourceState:
        s = SourceState(name, "d", interval=1.0, stale_after=2.0)
        for k, v in kw.items():
            setattr(s, k, v)
        return s
    now = 100.0
    out = {s["source"]: s for s in sources([
        st("up", up=True, last_success=99.5, last_attempt=99.5),
        st("stale", up=True, last_success=90.0, last_attempt=90.0),
        st("failing", up=False, last_success=99.0, last_attempt=99.9, last_error="timeout: poll exceeded 1.0s"),
        st("waiting")], now)}
    assert {k: v["state"] for k, v in out.items()} == {"up": "up", "stale": "stale", "failing": "failing",
                                                     "waiting": "waiting"}
    assert out["failing"]["why"] == "timeout: poll exceeded 1.0s" and out["stale"]["why"] == "no answer for 10 s"


def test_shared_sources_say_who_polls_them_and_idle_ones_are_not_failures():
    """Rack coordination: a shared device another agent polls is that device's health, said so; a tray read by
    the leader only is idle here, never failing or waiting."""
    def st(source, device, **kw) -> SourceState:
        s = SourceState(source, device, interval=1.0, stale_after=2.0)
        for k, v in kw.items():
            setattr(s, k, v)
        return s
    now = 100.0
    out = {f"{s['source']}/{s['device']}": s for s in sources([
        st("leak", "leak1", up=True, last_success=99.5, last_attempt=99.5),
        st("pdu", "pdu-a"),
        st("redfish", "bmc-node02", up=True, last_success=50.0, last_attempt=50.0),
        st("nvml", "node01", up=True, last_success=99.5, last_attempt=99.5)], now,
        remote=frozenset({("leak", "leak1"), ("pdu", "pdu-a")}), idle=frozenset({("redfish", "bmc-node02")}))}
    # The state and its why say who polls: the page shows nothing else about it (no `polled_here` flag, which
    # said True for the leader-only tray this agent does not read).
    assert {k: v["state"] for k, v in out.items()} == {
        "leak/leak1": "up", "pdu/pdu-a": "waiting", "redfish/bmc-node02": "idle", "nvml/node01": "up"}
    assert not any(v["state"] == "failing" for v in out.values())
    assert "another agent" in out["leak/leak1"]["why"] and "another agent" in out["pdu/pdu-a"]["why"]
    assert "leader" in out["redfish/bmc-node02"]["why"] and out["nvml/node01"]["why"] == ""


def test_the_coordination_line_is_up_with_its_leader_or_degraded_with_why():
    up = coordination({"backend": "etcd", "up": True, "leader": "node02", "leads": False,
                       "members": ["node01", "node02", "node03"], "polling": {"leak1": True, "pdu-a": False}, "why": ""})
    assert up == {"backend": "etcd", "state": "up", "leader": "node02", "this_agent_leads": False,
                  "members": ["node01", "node02", "node03"], "polls_here": ["leak1"], "polled_elsewhere": ["pdu-a"],
                  "why": ""}
    down = coordination({"backend": "etcd", "up": False, "leader": None, "leads": False, "members": None,
                         "polling": {"leak1": False}, "why": "EtcdError: every endpoint failed"})
    assert down["state"] == "degraded" and down["leader"] is None and down["why"].startswith("EtcdError")
    assert coordination(None) is None


def test_a_gpu_card_carries_the_judges_last_xid_recommendation_and_recovery_taken():
    faults = {"node01/1": {"last_xid": {"code": 48, "mnemonic": "ROBUST_CHANNEL_GPU_ECC_DBE",
                                        "description": "Double Bit ECC Error", "at": 5.0},
                           "recommended": "reboot", "rule": "reset_failed",
                           "last_recovery": {"action": "gpu_reset", "ok": False, "at": 6.0,
                                             "why": "reset did not clear the fault"}},
              "node01/0": {"last_xid": None, "recommended": "none", "rule": None, "last_recovery": None},
              "node02/1": {"last_xid": {"code": 13, "mnemonic": "X", "description": "Y", "at": 1.0},
                           "recommended": "app", "rule": "catalogue", "last_recovery": None}}
    card = ViewBuilder().node_card(snap(*_gpu("0"), *_gpu("1")), INV, "node01", DetectorSettings(),
                                   {"rack": "r01", "node": "node01"}, faults)
    g0, g1 = card["gpus"]
    assert g0["fault"] is None  # nothing judged: no line (and another node's GPU 1 is not this one's)
    assert g1["fault"] == {"xid": 48, "mnemonic": "ROBUST_CHANNEL_GPU_ECC_DBE", "description": "Double Bit ECC Error",
                           "recommended": "reboot", "rule": "reset_failed", "taken": "gpu_reset failed",
                           "taken_why": "reset did not clear the fault"}


def _card(*gpus: list[str]) -> dict:
    return {"gpus": [{"index": str(i), "nvlink": list(links)} for i, links in enumerate(gpus)]}


def test_nvlink_domain_matrix_is_the_worst_link_per_tray_and_chip():
    nodes = [
        {"name": "node01", "reach": "self", "card": _card(["ok", "down", "ok", "ok"], ["ok", "ok", "errors", "ok"])},
        {"name": "node02", "reach": "peer", "card": _card(["ok", "down", "ok", "ber"], ["ok", "errors", "ok", "ok"])},
        {"name": "node03", "reach": "peer", "card": _card(["ok", "ok", "ok"], ["ok", "ok", "ok", "ok"])},
        {"name": "node04", "reach": "unreachable", "why": "timeout"},  # no card: a row of unknown, never of ok
    ]
    m = nvlink_domain(nodes)
    assert [c["index"] for c in m["chips"]] == [0, 1, 2, 3] and m["switch_trays"] == []
    rows = {r["node"]: r["cells"] for r in m["rows"]}
    assert rows["node01"] == ["ok", "down", "errors", "ok"]
    assert rows["node02"] == ["ok", "down", "ok", "ber"]  # down beats errors, ber beats ok
    assert rows["node03"] == ["ok", "ok", "ok", "unknown"]  # GPU 0 reported 3 links only: chip 3 is not known ok
    assert rows["node04"] == ["unknown"] * 4
    assert [r["node"] for r in m["rows"]] == ["node01", "node02", "node03", "node04"]


def test_the_nvlink_domain_carries_the_racks_verdict_and_none_where_the_agent_does_not_attribute():
    """Issue 34: the page says which switch chips (and trays) the rack calls at fault, from the agent's own verdict
    (supernode_nvlink_switch_fault); an agent with no verdict (no NVLink domain, or coordination lost: the readings
    aged out) says nothing rather than "no fault"."""
    from agent.coordination.link_share import NVLINK_SWITCH_FAULT, NVLINK_TRAY_SIDE_LINKS

    verdict = [r(NVLINK_SWITCH_FAULT, 1.0 if k in (5, 6) else 0.0, switch_chip=str(k),
                 switch_tray="switch03" if k in (4, 5) else "") for k in range(18)]
    a = nvlink_attribution(snap(*verdict, r(NVLINK_TRAY_SIDE_LINKS, 2.0)))
    assert a == {"switch_side": [{"chip": 5, "switch_tray": "switch03"}, {"chip": 6, "switch_tray": ""}],
                 "tray_side_links": 2}
    assert nvlink_domain([], (), a)["attribution"] == a
    assert nvlink_attribution(snap(*[r(NVLINK_SWITCH_FAULT, 0.0, switch_chip=str(k), switch_tray="")
                                     for k in range(18)])) == {"switch_side": [], "tray_side_links": 0}
    assert nvlink_attribution(snap(*[r(NVLINK_SWITCH_FAULT, 1.0, Quality.STALE, switch_chip="5", switch_tray="")])) \
        is None
    assert nvlink_attribution(snap()) is None


def test_nvlink_domain_columns_carry_their_switch_tray():
    trays = [SimpleNamespace(name="switch01", chips=[0, 1]), SimpleNamespace(name="switch02", chips=[3, 2])]
    m = nvlink_domain([{"name": "node01", "reach": "self", "card": _card(["ok", "ok"])}], trays)
    assert [(c["index"], c["switch_tray"]) for c in m["chips"]] == [(0, "switch01"), (1, "switch01"),
                                                                     (2, "switch02"), (3, "switch02")]
    assert m["switch_trays"] == [{"name": "switch01", "chips": [0, 1]}, {"name": "switch02", "chips": [2, 3]}]
    assert m["rows"][0]["cells"] == ["ok", "ok", "unknown", "unknown"]
