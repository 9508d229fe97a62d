"""Rack approvals belong to one episode and one step, name who approved, and cannot be forged by an etcd writer
(issue 31, findings 2 and 5).

First the record validator and the proof (pure functions, property-tested on arbitrary records), then the real
daemon: three agents, a 3-member etcd cluster, the simulated rack (one module-scoped rack; each test leaves it
as it found it). The attacker writes etcd directly (`EtcdCluster.put`), as anyone who reaches etcd can.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from agent.coordination.approvals import Step, approval_of, approval_proof, pending_record, rack_approval_id
from agent.coordination.records import RecordError
from agent.remediation.incidents import incident_key
from tests.agentproc import AgentProcess
from tests.coordination_rack import (TOKEN, EtcdRack, approval_refused, approve, etcd_rack, incidents, journal, metric)
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[1]

NOW = 1_800_000_000.0
SKEW = 5.0
EXPIRY = 3600.0
NODES = ("node01", "node02", "node03")
ZONE = {"node01": "zone-a", "node02": "zone-b", "node03": "zone-c"}
ZONE_VALVE = {"zone-a": "cdu=cdu1,point=zone_valve_1", "zone-b": "cdu=cdu1,point=zone_valve_2"}  # zone-c: none
SHARED = ("leak1", "cdu1", "rdhx1", "pdu-a", "rfcdu1")
TOKENS = {"alice": SecretStr("alice-secret"), "bob": SecretStr("bob-secret")}
STEP = Step(rid=rack_approval_id("leak|zone=zone-b", "leak-1a2b3c4d", "cdu_write", "cdu=cdu1,point=zone_valve_2",
                                 "apply"),
            incident_id="leak-1a2b3c4d", action="cdu_write", target="cdu=cdu1,point=zone_valve_2", phase="apply",
            revision=100, created_at=NOW - 30)


def approved(who: str = "alice", secret: str | None = None, at: float = NOW - 5, **over: Any) -> dict[str, Any]:
    """A genuine approval of STEP by `who` (its proof keyed with `secret`, by default who's own token)."""
    doc = {"id": STEP.rid, "incident_id": STEP.incident_id, "incident_key": "leak|zone=zone-b",
           "incident_opened_at": NOW - 40, "action": STEP.action, "target": STEP.target, "phase": STEP.phase,
           "approval": "cdu_write_valve", "created_at": STEP.created_at, "expires_at": STEP.created_at + EXPIRY,
           "requested_by": "node01", "state": "approved", "approved_by": who, "approved_via": "node02",
           "approved_at": at, "pending_revision": STEP.revision, "all": False,
           "proof": approval_proof(secret if secret is not None else TOKENS[who], STEP.rid, STEP.revision,
                                   STEP.incident_id, who, at, "node02", False)}
    doc.update(over)
    return doc


def check(doc: Any, create: int = 100, mod: int = 104):
    raw = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    return approval_of(raw, create, mod, STEP, TOKENS, NODES, NOW, SKEW, EXPIRY)


def why(doc: Any, create: int = 100, mod: int = 104) -> str:
    with pytest.raises(RecordError) as exc:
        check(doc, create, mod)
    return exc.value.why


def test_a_genuine_approval_names_the_person_and_the_agent_that_checked_the_token():
    got = check(approved())
    assert (got.approved_by, got.approved_via, got.revision, got.all) == ("alice", "node02", 104, False)


def test_a_pending_record_is_no_approval_and_no_error():
    assert check(approved(state="pending")) is None


def test_state_approved_without_a_proof_is_refused():
    doc = approved()
    del doc["proof"]
    assert why(doc) == "no_proof"


def test_a_proof_made_with_another_token_or_for_another_person_is_refused():
    assert why(approved(secret="guessed")) == "bad_proof"
    # bob's name on alice's proof
    assert why(dict(approved("alice"), approved_by="bob")) == "bad_proof"
    # a token this agent does not hold
    assert why(approved("mallory", secret="x")) == "unknown_token"
    # a genuine approval whose journaled fields an etcd writer rewrote
    assert why(dict(approved(), approved_via="node03")) == "bad_proof"
    assert why(dict(approved(), all=True)) == "bad_proof"


def test_an_approval_for_another_pending_record_or_episode_or_step_is_refused():
    assert why(approved(), create=99) == "stale"  # the key was made afresh: another pending record
    assert why(approved(pending_revision=99)) == "stale"
    assert why(approved(), create=100, mod=100) == "stale"  # written with the record, not after it
    assert why(approved(incident_id="leak-00000000")) == "other_episode"
    assert why(approved(phase="undo")) == "other_step"
    assert why(approved(id="rack-000000000000")) == "other_step"


def test_times_are_checked_a_ten_year_expiry_and_an_approval_older_than_the_step_are_refused():
    assert why(approved(expires_at=NOW + 10 * 365 * 86400)) == "future"
    assert why(approved(created_at=NOW - 20, expires_at=NOW + EXPIRY)) == "expiry"  # 3620 s + more than skew
    assert why(approved(at=STEP.created_at - 600)) == "stale"  # approved before the step asked
    assert why(approved(at=NOW + 60)) == "future"
    assert why(approved(approved_via="node99")) == "unknown_node"


def test_the_episode_is_in_the_rack_id():
    a = rack_approval_id("leak|zone=zone-b", "leak-1", "cdu_write", "t", "apply")
    assert a != rack_approval_id("leak|zone=zone-b", "leak-2", "cdu_write", "t", "apply")


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                  max_size=4), max_leaves=12)
_FIELDS = st.sampled_from(sorted(approved()))


@given(st.one_of(st.binary(max_size=200), _JSON.map(json.dumps),
                 st.dictionaries(_FIELDS, _JSON, max_size=6).map(lambda over: json.dumps(approved(**over))),
                 # well-formed approvals whose proof is keyed with any secret, a person's token or not
                 st.builds(lambda who, secret, proof_for: json.dumps(dict(approved(who, secret=secret),
                                                                          approved_by=proof_for)),
                           st.sampled_from(sorted(TOKENS)), st.sampled_from(["alice-secret", "bob-secret", "", "x"])
                           | st.text(max_size=12), st.sampled_from(sorted(TOKENS))),
                 st.text("0123456789abcdef", min_size=64, max_size=64).map(
                     lambda proof: json.dumps(approved(proof=proof))),
                 st.lists(_FIELDS, max_size=4).map(lambda drop: json.dumps(
                     {k: v for k, v in approved().items() if k not in drop}))),
       st.just(STEP.revision) | st.integers(0, 200), st.just(104) | st.integers(0, 200))
def test_any_record_never_raises_and_is_never_accepted_without_the_right_proof(raw, create, mod):
    """Arbitrary bytes, arbitrary JSON, a genuine approval with any fields replaced or dropped: the validator
    answers (None, an Approval or RecordError), and accepts only a proof keyed with the named person's token
    over this very step, pending record, episode and approval time."""
    try:
        got = check(raw, create, mod)
    except RecordError:
        return
    if got is None:
        return
    doc = json.loads(raw)
    assert create == STEP.revision and mod > create and doc["pending_revision"] == STEP.revision
    assert doc["proof"] == approval_proof(TOKENS[got.approved_by], STEP.rid, STEP.revision, STEP.incident_id,
                                          got.approved_by, got.approved_at, got.approved_via, got.all)
    assert (doc["id"], doc["incident_id"], doc["action"], doc["target"], doc["phase"]) == \
        (STEP.rid, STEP.incident_id, STEP.action, STEP.target, STEP.phase)
    assert math.isfinite(got.approved_at) and STEP.created_at - SKEW <= got.approved_at <= NOW + SKEW


EVIDENCE = {"leak_scope": "zone", "dry_hold_seconds": 900.0,
            "dry_history": [{"zone": "zone-b", "sensor": "rope2", "state": "dry", "last_wet_at": NOW - 2000,
                             "dry_since": NOW - 1000, "last_read_at": NOW - 1}]}


def test_a_records_dry_history_is_checked_and_its_dry_seconds_counted_when_shown():
    from agent.coordination.approval_evidence import view

    doc = pending_record(json.dumps(dict(approved(state="pending"), evidence=EVIDENCE)), NOW, SKEW, EXPIRY)
    shown = view(doc["evidence"], NOW)
    assert shown["dry_history"][0]["dry_seconds"] == 1000.0 and shown["dry_hold_passed"] is True
    assert view(doc["evidence"], NOW - 200)["dry_hold_passed"] is False  # 800 s of 900


@pytest.mark.parametrize("row", [{"state": "damp"}, {"dry_since": None}, {"dry_since": "yesterday"},
                                 {"dry_since": NOW + 3600}, {"sensor": 7}, {"zone": "z" * 500},
                                 {"last_wet_at": float("inf")}])
def test_a_garbled_dry_history_refuses_the_whole_record(row):
    bad = dict(EVIDENCE, dry_history=[dict(EVIDENCE["dry_history"][0], **row)])
    with pytest.raises(RecordError) as exc:
        pending_record(json.dumps(dict(approved(state="pending"), evidence=bad)), NOW, SKEW, EXPIRY)
    assert exc.value.why == "evidence"


@given(_JSON)
def test_any_evidence_never_raises_anything_but_a_record_error(evidence):
    try:
        pending_record(json.dumps(dict(approved(state="pending"), evidence=evidence)), NOW, SKEW, EXPIRY)
    except RecordError:
        pass


@given(_JSON.map(json.dumps) | st.binary(max_size=100))
def test_pending_record_never_raises_anything_but_a_record_error(raw):
    try:
        doc = pending_record(raw, NOW, SKEW, EXPIRY)
    except RecordError:
        return
    assert isinstance(doc, dict) and doc["expires_at"] - doc["created_at"] <= EXPIRY + SKEW


# -- the real daemon -------------------------------------------------------------------------------------------


class Rack(EtcdRack):
    def valve_open(self, zone: str) -> bool:
        return self.sim.sim.model.coolant.valve_open[zone]

    def clear(self, *zones: str) -> None:
        """The leak dries; every incident resolved; the valves open again (as a person would leave them)."""
        super().clear()
        with self.sim.sim.model.lock:
            for zone in zones:
                self.sim.sim.model.coolant.valve_open[zone] = True


def _watch_trays(cfg: dict, node: str, sim: Any) -> None:
    cfg["sources"]["redfish"]["watch_rack_trays"] = True


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("approvals"), _watch_trays, Rack)


def valve_close_pending(agent: AgentProcess, zone: str, phase: str = "apply") -> dict[str, Any]:
    """The leader's valve step of `zone` waiting for a person, as `agent` lists it (the leader: with its rack id)."""
    return wait_for(lambda: next((p for p in incidents(agent).get("pending_approvals", [])
                                  if p["action"] == "cdu_write" and p["target"] == ZONE_VALVE[zone]
                                  and p["phase"] == phase), None), 90, what=f"{zone}'s valve {phase} waiting")


def rows(agent: AgentProcess, since: int, **match: Any) -> list[dict[str, Any]]:
    return [e for e in journal(agent) if e["seq"] > since and all(e.get(k) == v for k, v in match.items())]


def last_seq(agent: AgentProcess) -> int:
    return max((e["seq"] for e in journal(agent)), default=0)


def rejected(agent: AgentProcess, why: str) -> float:
    return metric(agent, "supernode_coordination_rejected_records_total", key_kind="approval", why=why) or 0.0


def test_state_approved_written_into_etcd_is_refused_and_a_persons_approval_is_journaled_before_the_valve_closes(
        rack):
    """An etcd writer sets the pending valve close to `approved` (no admin token, no proof): the leader refuses
    it, counts it, journals why, and the step keeps waiting (asked again). Then a person approves through a
    follower's API: the valve closes, and the LEADER's journal names the token and the agent that checked it,
    before the cdu_write intent."""
    rack.steady()
    leader = rack.leader()
    follower = next(a for a in rack.agents if a is not leader)
    zone = "zone-b"
    since = last_seq(leader)
    rack.sim.inject("leak", zone=zone)
    try:
        mine = valve_close_pending(leader, zone)
        key = f"{rack.root}/approvals/{mine['rack_id']}"
        raw = wait_for(lambda: rack.etcd.get(key), 20, what="the pending record in etcd")
        doc = json.loads(raw)
        assert doc["state"] == "pending"
        forged = dict(doc, state="approved", approved_by="admin", approved_via=follower.config["agent"]["node"],
                      approved_at=time.time(), expires_at=time.time() + 10 * 365 * 86400)
        rack.etcd.put(key, json.dumps(forged))
        refused = wait_for(lambda: rows(leader, since, kind="approval", action_id=mine["id"], result="refused"), 30,
                           what="the forged approval refused on the leader")
        assert refused[0]["detail"]["rack_id"] == mine["rack_id"]
        assert rejected(leader, refused[0]["detail"]["why"]) >= 1
        # asked again: the step waits, listed on every agent, and nothing reached the CDU
        wait_for(lambda: json.loads(rack.etcd.get(key) or b"{}").get("state") == "pending", 30,
                 what="the pending record written afresh")
        rack_id = valve_close_pending(follower, zone)["id"]
        assert rack_id == mine["rack_id"]
        assert rack.valve_open(zone) is True
        assert not rows(leader, since, kind="intent", action="cdu_write")
        assert not rows(leader, since, kind="approval", action_id=mine["id"], result="approved")

        assert approve(follower, rack_id) == [rack_id]
        wait_for(lambda: rack.valve_open(zone) is False, 30, what="zone valve closed")
        (ok,) = rows(leader, since, kind="approval", action_id=mine["id"], result="approved")
        (intent,) = rows(leader, since, kind="intent", action="cdu_write", action_id=mine["id"])
        assert ok["detail"]["approved_by"] == "admin"
        assert ok["detail"]["approved_via"] == follower.config["agent"]["node"]
        assert ok["detail"]["rack_revision"] > ok["detail"]["pending_revision"]
        assert ok["seq"] < intent["seq"]
    finally:
        rack.clear(zone)


def test_an_approval_planted_before_the_leak_with_a_ten_year_expiry_is_refused_and_the_valve_stays_open(rack):
    """Planted where the old, fault-only approval id put it, `approved` for ten years: counted as it lands, and
    the leak's valve close still waits for a person."""
    rack.steady()
    leader = rack.leader()
    zone = "zone-a"
    key_of_fault = incident_key("leak", {"zone": zone})
    old_id = "rack-" + hashlib.sha1(f"{key_of_fault}|cdu_write|{ZONE_VALVE[zone]}|apply".encode()).hexdigest()[:12]
    planted = f"{rack.root}/approvals/{old_id}"
    now = time.time()
    before = rejected(leader, "future")
    rack.etcd.put(planted, json.dumps({
        "id": old_id, "incident_id": "leak-00000000", "incident_key": key_of_fault, "action": "cdu_write",
        "target": ZONE_VALVE[zone], "phase": "apply", "state": "approved", "created_at": now,
        "expires_at": now + 10 * 365 * 86400, "requested_by": leader.config["agent"]["node"],
        "approved_by": "admin", "approved_at": now}))
    try:
        since = last_seq(leader)
        rack.sim.inject("leak", zone=zone)
        mine = valve_close_pending(leader, zone)
        # the leader's own record is what a person approves; the planted one is no step of anyone's
        other = next(a for a in rack.agents if a is not leader)
        assert valve_close_pending(other, zone)["id"] == mine["rack_id"] != old_id
        assert rack.valve_open(zone) is True
        assert not rows(leader, since, kind="intent", action="cdu_write")
        assert not rows(leader, since, kind="approval", result="approved")
        assert rejected(leader, "future") > before  # counted as it landed
    finally:
        rack.etcd.delete(planted)
        rack.clear(zone)


def resolved(agent: AgentProcess, incident_id: str) -> dict[str, Any]:
    return wait_for(lambda: next((i for i in incidents(agent).get("recent", []) if i["id"] == incident_id
                                  and i.get("resolved_at")), None), 60, what=f"{incident_id} resolved")


def test_an_incident_id_of_an_earlier_episode_approves_nothing_now_neither_apply_nor_undo(rack):
    """A follower's incident of the first leak, resolved; the same fault again later: its id approves neither
    the new valve close nor the new valve reopen. The new episode's own incident id approves the reopen."""
    rack.steady()
    leader = rack.leader()
    zone = "zone-a"
    # the approver: neither the leader nor zone-a's own node (whose own resume would make two steps)
    follower = next(a for a in rack.agents if a is not leader and ZONE[a.config["agent"]["node"]] != zone)

    def follower_incident() -> dict[str, Any]:
        return wait_for(lambda: next((i for i in incidents(follower).get("open", []) if i["detector"] == "leak"
                                      and i["targets"]["zone"] == zone), None), 30, what="the leak open on a follower")

    rack.sim.inject("leak", zone=zone)
    try:
        valve_close_pending(leader, zone)
        first = follower_incident()
    finally:
        rack.clear(zone)
    first = resolved(follower, first["id"])
    # episodes of one fault further apart than detection lag and skew (10 s + 5 s) are told apart
    wait_for(lambda: time.time() > first["resolved_at"] + 16, 30, interval=0.5, what="time between the episodes")
    since = last_seq(leader)
    rack.sim.inject("leak", zone=zone)
    try:
        close = valve_close_pending(follower, zone)
        second = follower_incident()
        assert approval_refused(follower, first["id"]) and rack.valve_open(zone) is True
        assert approve(follower, close["id"]) == [close["id"]]
        wait_for(lambda: rack.valve_open(zone) is False, 30, what="zone valve closed")
        rack.sim.clear()
        reopen = valve_close_pending(follower, zone, phase="undo")
        # the leader's dry history of the zone's detectors, shown by a follower from the rack's record (issue 35)
        assert reopen["leak_scope"] == "zone" and reopen["dry_hold_passed"] is True, reopen
        assert reopen["dry_history"] and all(r["zone"] == zone and r["state"] == "dry"
                                             and r["dry_seconds"] >= reopen["dry_hold_seconds"]
                                             for r in reopen["dry_history"]), reopen["dry_history"]
        assert any(r["last_wet_at"] for r in reopen["dry_history"])  # the detector that read the leak
        # an etcd writer garbles the history (a wet detector shown dry would pass for it): refused on every agent,
        # counted, and the leader writes its record afresh, so the person is never shown a made-up history
        key = f"{rack.root}/approvals/{reopen['id']}"
        garbled = json.loads(rack.etcd.get(key))
        garbled["evidence"]["dry_history"][0].update(state="dry", dry_since="yesterday")
        rack.etcd.put(key, json.dumps(garbled))
        wait_for(lambda: [e for e in rows(leader, since, kind="approval", result="refused")
                          if e["detail"].get("why") == "evidence"], 30, what="the garbled history refused")
        assert (metric(follower, "supernode_coordination_rejected_records_total", key_kind="approval",
                       why="evidence") or 0.0) >= 1
        again = wait_for(lambda: next((p for p in incidents(follower).get("pending_approvals", [])
                                       if p["id"] == reopen["id"] and p.get("dry_history")), None), 30,
                         what="the record written afresh, its history whole")
        assert [r["sensor"] for r in again["dry_history"]] == [r["sensor"] for r in reopen["dry_history"]]
        assert all(isinstance(r["dry_since"], float) for r in again["dry_history"])
        second = resolved(follower, second["id"])
        assert approval_refused(follower, first["id"])
        assert valve_close_pending(follower, zone, phase="undo")["id"] == reopen["id"]
        assert rack.valve_open(zone) is False
        assert not rows(leader, since, kind="approval", phase="undo", result="approved")
        assert approve(follower, second["id"]) == [reopen["id"]]
        wait_for(lambda: rack.valve_open(zone) is True, 30, what="zone valve reopened by the new episode's approval")
    finally:
        rack.clear(zone)


def cli(agent: AgentProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(agent.config_path), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60, env=dict(os.environ))


def test_approve_by_incident_with_two_pending_steps_lists_them_and_all_approves_both(rack):
    """A zone leak on a follower's node, its own tray wet too: the tray's power-off waits there, and the zone's
    valve close waits on the leader. `approve <incident>` on the follower lists both (409) and approves neither;
    `--all` approves both, and the journals (the follower's, and the leader's for the valve) say all. (The tray
    alone would be its own tray-scoped leak, whose zone valve is never asked: issue 35.)"""
    rack.steady()
    leader = rack.leader()
    node = next(n for n in ("node01", "node02") if n != leader.config["agent"]["node"])  # zones with a valve
    agent, zone = rack.by_node(node), ZONE[node]
    since = {a: last_seq(a) for a in (agent, leader)}
    rack.sim.inject("tray-leak", node=node, detector="0")
    try:
        wait_for(lambda: [i for i in incidents(agent).get("open", []) if i["detector"] == "leak_tray"], 40,
                 what="the tray's own leak")
        rack.sim.inject("leak", zone=zone)  # the zone's own sensor: the zone's scope, the tray wet in it

        def both() -> list[dict[str, Any]] | None:
            inc = next((i["id"] for i in incidents(agent).get("open", []) if i["detector"] == "leak"), None)
            got = [p for p in incidents(agent).get("pending_approvals", []) if p["phase"] == "apply"
                   and (p["action"] == "cdu_write" or (p["action"] == "tray_power" and p["incident_id"] == inc))]
            return got if sorted(p["action"] for p in got) == ["cdu_write", "tray_power"] else None
        steps = wait_for(both, 40, what="the tray power-off and the valve close waiting")
        incident_id = next(p["incident_id"] for p in steps if p["action"] == "tray_power")  # the agent's zone leak
        status, body = agent.request("POST", f"/api/v1/incidents/{incident_id}/approve", token=TOKEN)
        assert status == 409, body
        assert sorted((p["action"], p["id"]) for p in json.loads(body)["pending"]) == \
            sorted((p["action"], p["id"]) for p in steps)
        listed = cli(agent, "approve", incident_id)
        assert listed.returncode == 1 and all(p["id"] in listed.stderr for p in steps), listed.stderr
        assert "--all" in listed.stderr
        assert not rows(agent, since[agent], kind="approval", result="approved")
        assert rack.valve_open(zone) is True
        done = cli(agent, "approve", incident_id, "--all")
        assert done.returncode == 0 and all(p["id"] in done.stdout for p in steps), (done.stdout, done.stderr)
        wait_for(lambda: rack.valve_open(zone) is False, 30, what="zone valve closed")
        approved = rows(agent, since[agent], kind="approval", result="approved")
        assert sorted(e["action_id"] for e in approved) == sorted(p["id"] for p in steps)
        assert all(e["detail"]["all"] is True and e["detail"]["approved_by"] == "admin" for e in approved)
        (valve,) = wait_for(lambda: rows(leader, since[leader], kind="approval", action="cdu_write",
                                         result="approved"), 30, what="the valve approval on the leader")
        assert valve["detail"]["all"] is True and valve["detail"]["approved_via"] == node
    finally:
        rack.clear(zone)
