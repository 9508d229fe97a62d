"""What agents read back from etcd is validated before a decision uses it (issue 31): guard records and the leader.

The production coordinators run in this process on a real etcd member; the test writes the rack's keys
directly, as anyone who reaches etcd could. Each test fails on code that trusts those keys: a garbled
record crashed the leak response's guardrails (JSONDecodeError, TypeError), far-future reservations of
nodes outside the rack blocked a real drain for ever, and a leader key written without a lease stopped
every agent from campaigning while none led.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from hypothesis import given, strategies as st
from pydantic import SecretStr

from agent.coordination import CoordinationCollector
from agent.coordination import etcd_rack
from agent.coordination.etcd import KV
from agent.coordination.records import Rejections, actions_doc, drains_doc
from agent.drill.plan import parse_plan
from agent.drill.rack import RackChannel
from agent.drill.records import announcement, node_doc
from agent.drill.scenarios import Rack
from agent.remediation.guardrails import Guardrails
from tests.coordination_inprocess import NODES, RACK, coordinator, rack, start, stop
from tests.etcd import running_etcd
from tests.helpers import await_for

NOW = 1_900_000_000.0
SKEW = 5.0
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                         max_size=4),
                           max_leaves=20)
raw_records = st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                        st.dictionaries(st.sampled_from(NODES + ["ghost", ""]),
                                        st.one_of(st.floats(), st.text(max_size=5), st.integers()), max_size=5
                                        ).map(lambda d: json.dumps(d).encode()))


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from running_etcd(tmp_path_factory.mktemp("etcd-trust"), 1)


# -- the validators on any input (no etcd) ---------------------------------------------------------------------

@given(raw=raw_records)
def test_drain_reservations_from_any_record_are_inventory_nodes_at_times_not_in_the_future(raw):
    rej = Rejections()
    doc = drains_doc(raw, NODES, NOW, SKEW, rej)
    assert set(doc) <= set(NODES)
    assert all(isinstance(t, float) and math.isfinite(t) and 0 <= t <= NOW + SKEW for t in doc.values())


@given(raw=raw_records)
def test_action_counts_from_any_record_are_times_and_a_breaker_of_the_right_shape(raw):
    doc = actions_doc(raw, NODES, NOW, SKEW, Rejections())
    times = doc.recent + [t for ts in doc.kinds.values() for t in ts]
    assert all(math.isfinite(t) and 0 <= t <= NOW + SKEW for t in times)
    assert doc.breaker == {} or (isinstance(doc.breaker["open"], bool) and doc.breaker["at"] <= NOW + SKEW)
    if doc.breaker.get("open"):
        assert doc.breaker["by"] in NODES
    json.dumps(doc.as_json(), allow_nan=False)  # what is written back is plain JSON


def test_each_rejected_entry_is_counted_by_kind_and_why_and_logged_once_per_revision(caplog):
    rej = Rejections()
    raw = json.dumps({"n1": NOW - 1, "ghost": NOW, "n2": NOW + 3600, "n3": "soon"}).encode()
    for _ in range(3):  # the same record read three times: counted each time, logged once
        assert drains_doc(raw, NODES, NOW, SKEW, rej, "k", 7) == {"n1": NOW - 1}
    assert rej.counts == {("guard_drains", "unknown_node"): 3, ("guard_drains", "future"): 3,
                          ("guard_drains", "type"): 3}
    assert sum("coordination record rejected" in r.message for r in caplog.records) == 1  # once per key+revision
    assert drains_doc(b"{not json", NODES, NOW, SKEW, rej, "k", 8) == {}
    assert rej.counts[("guard_drains", "not_json")] == 1


# -- guard records on a real etcd --------------------------------------------------------------------------------

GARBAGE = [b"{not json", b"[1, 2]", b'"text"', b"null", b'{"n1": "yesterday"}', b'{"recent": "x", "kinds": 3}',
           b'{"breaker": {"open": "yes"}}', b'{"recent": [1e400], "breaker": {"open": true, "at": 1, "by": "ghost"}}',
           b"\xff\xfe"]


@pytest.mark.parametrize("raw", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_in_the_guard_keys_neither_raises_nor_blocks_and_the_next_write_repairs_it(tmp_path, etcd, raw):
    """Bad JSON in guard/drains or a non-number in guard/actions used to raise out of the guardrail (the leak
    response crashed, no drain, no cap). Now: rejected and counted, the decision counts only what is valid
    (nothing here), and the value written back is a valid document."""
    prefix = f"/garbage{GARBAGE.index(raw)}"

    async def run() -> tuple:
        etcd.put(f"{prefix}/{RACK}/guard/drains", raw)
        etcd.put(f"{prefix}/{RACK}/guard/actions", raw)
        coords = await rack(tmp_path, etcd, prefix)
        try:
            guard = Guardrails(coords[0].guardrails)
            drain = await coords[0].check_drain("n1", [], len(NODES), guard)
            action = await coords[0].reserve_action("gpu_power_cap", guard)
            return drain, action, coords[0].rejections.counts, coords[0].breaker_open()
        finally:
            await stop(coords)
    drain, action, counts, breaker = asyncio.run(run())
    assert drain is None and action is None, (drain, action)
    assert breaker is False
    assert sum(counts.values()) >= 1, counts
    drains, actions = (json.loads(etcd.get(f"{prefix}/{RACK}/guard/{k}") or b"") for k in ("drains", "actions"))
    assert set(drains) == {"n1"}
    assert actions["kinds"] == {"gpu_power_cap": [pytest.approx(actions["recent"][0])]}


def test_far_future_reservations_of_nodes_outside_the_rack_do_not_block_a_real_drain(tmp_path, etcd):
    """Three reservations dated in 2300 for node names not in the inventory used to fill the blast radius for
    ever (max 1 drained node here). Only inventory nodes count, and a reservation's time cannot be ahead."""
    prefix = "/farfuture"
    etcd.put(f"{prefix}/{RACK}/guard/drains", json.dumps({"x1": 1e10, "x2": 1e10, "x3": 1e10, "n2": 1e10}))

    async def run() -> tuple:
        coords = await rack(tmp_path, etcd, prefix, max_drained_nodes=1, max_drained_fraction=1.0)
        try:
            guard = Guardrails(coords[0].guardrails)
            return await coords[0].check_drain("n1", [], len(NODES), guard), coords[0].rejections.counts
        finally:
            await stop(coords)
    blocked, counts = asyncio.run(run())
    assert blocked is None, blocked
    assert counts[("guard_drains", "unknown_node")] >= 3 and counts[("guard_drains", "future")] >= 1, counts


def test_a_valid_reservation_of_another_agent_still_counts(tmp_path, etcd):
    """The validation drops only what cannot be true: a fresh reservation by another inventory node holds its
    place (racing agents never pass the blast radius together)."""
    prefix = "/validres"

    async def run() -> tuple:
        coords = await rack(tmp_path, etcd, prefix, max_drained_nodes=1, max_drained_fraction=1.0)
        try:
            guard = Guardrails(coords[0].guardrails)
            first = await coords[1].check_drain("n2", [], len(NODES), guard)
            await await_for(lambda: f"{prefix}/{RACK}/guard/drains" in coords[0].mirror, 10, what="the reservation seen")
            second = await coords[0].check_drain("n1", [], len(NODES), guard)
            return first, second
        finally:
            await stop(coords)
    first, second = asyncio.run(run())
    assert first is None
    assert second is not None and second[0] == "blast_radius" and "n2" in second[1], second


# -- the leader -----------------------------------------------------------------------------------------------

def _leaders(coords) -> list[str]:
    return [c.node for c in coords if c.is_leader()]


@pytest.mark.parametrize("kind", ["no_lease", "unknown_node", "not_member"])
def test_a_leader_key_that_names_no_leader_is_removed_and_a_member_elected(tmp_path, etcd, kind):
    """A `leader` key written by hand (no lease; a node outside the rack; a member's name under someone else's
    lease) used to stop every agent from campaigning (the key exists) while none led: shared steps then did
    nothing. Now it is rejected (counted), deleted, and one member leads under its own member lease."""
    prefix = f"/ghost-{kind}"
    key = f"{prefix}/{RACK}/leader"
    if kind == "no_lease":
        etcd.put(key, "n2")
    elif kind == "unknown_node":
        etcd.put(key, "intruder", lease=etcd.lease_grant(120))
    else:
        etcd.put(key, "n1", lease=etcd.lease_grant(120))

    async def run() -> tuple:
        coords = await rack(tmp_path, etcd, prefix)
        try:
            await await_for(lambda: len(_leaders(coords)) == 1 and len({c.leader_node() for c in coords}) == 1, 30,
                            what="one elected leader, seen by every agent")
            leader = next(c for c in coords if c.is_leader())
            seen = {c.leader_node() for c in coords}
            return leader, seen, sum(c.rejections.counts.get(("leader", kind), 0) for c in coords), etcd.lease_of(key)
        finally:
            await stop(coords)
    leader, seen, rejected, lease = asyncio.run(run())
    assert seen == {leader.node}
    assert rejected >= 1
    assert lease == leader.lease != 0


def test_no_leader_seconds_counts_while_coordinating_without_a_valid_leader(tmp_path, monkeypatch, etcd):
    """The metric behind SupernodeCoordinationNoLeader, on a deterministic clock: it counts from the moment this
    agent (up) sees no valid leader, holds 0 while it sees one, and 0 while degraded (its own alert covers that)."""
    now = [1000.0]
    monkeypatch.setattr(etcd_rack, "MONOTONIC", lambda: now[0])
    c = coordinator(tmp_path, etcd, "n1", "/clock")
    c.connected, c.deadline = True, 1e9
    root = f"/clock/{RACK}"
    c.mirror[f"{root}/leader"] = KV(f"{root}/leader", b"n2", 5, 5, 0)  # a ghost: no lease
    c._track_leader()
    now[0] += 11.0
    c._track_leader()
    assert c.no_leader_seconds() == 11.0
    fam = {m.name: m for m in CoordinationCollector(c).collect()}
    assert fam["supernode_coordination_no_leader_seconds"].samples[0].value == 11.0
    assert fam["supernode_coordination_lease_ttl_seconds"].samples[0].value == c.ttl
    c.mirror[f"{root}/members/n2"] = KV(f"{root}/members/n2", b"n2", 6, 6, 77)
    c.mirror[f"{root}/leader"] = KV(f"{root}/leader", b"n2", 7, 7, 77)  # n2's own member lease: a leader
    c._track_leader()
    assert c.leader_node() == "n2" and c.no_leader_seconds() == 0.0
    c.mirror[f"{root}/leader"] = KV(f"{root}/leader", b"n2", 8, 8, 0)
    c._track_leader()
    now[0] += 3.0
    c.deadline = 0.0  # degraded: not this metric's business
    assert c.no_leader_seconds() == 0.0


def test_members_are_inventory_nodes_under_a_lease(tmp_path, etcd):
    """A member key for a name outside the rack, or one written without a lease, is nobody: it neither counts as
    alive (poller ranking, the members gauge) nor can it hold the leadership."""
    prefix = "/members"
    etcd.put(f"{prefix}/{RACK}/members/intruder", "intruder", lease=etcd.lease_grant(120))
    etcd.put(f"{prefix}/{RACK}/members/n3", "n3")  # no lease: n3's agent is not running

    async def run() -> list[str]:
        coords = await start([coordinator(tmp_path, etcd, n, prefix) for n in ("n1", "n2")])
        try:
            await await_for(lambda: len(_leaders(coords)) == 1, 30, what="a leader")
            # n2's own member key reached n1's view (a leader can be elected before it on a loaded host)
            await await_for(lambda: "n2" in coords[0].members(), 30, what="n1 seeing n2")
            return coords[0].members()
        finally:
            await stop(coords)
    assert asyncio.run(run()) == ["n1", "n2"]


# -- fault drill documents (drill/<node>) ---------------------------------------------------------------------

def test_a_drill_document_is_taken_only_under_its_nodes_member_lease_and_a_drill_ends_with_its_conductor(
        tmp_path, etcd):
    """A zone drill reaches the zone's other agents as its conductor's signed document under `drill/<node>`.
    One written there by anyone else (etcd root here, under a lease that is not that node's member lease) is
    rejected and counted, even with a valid proof; the genuine one is taken, and when its conductor's lease goes
    (the agent stopped) the drill ends at the others (agent/drill/rack.py)."""
    prefix = "/drills"
    plan = parse_plan({"name": "d", "scenario": {"kind": "leak", "zone": "z"}, "nodes": ["n1", "n2"]})
    token = {"admin": SecretStr("drill-admin-token")}
    heard: dict[str, list] = {n: [] for n in NODES}

    async def run() -> dict:
        coords = [coordinator(tmp_path, etcd, n, prefix) for n in NODES]
        for c in coords:
            c.drill_channel = RackChannel(c, c.node, NODES, lambda: token,
                                          lambda c=c: Rack(node=c.node, nodes=NODES, zones={"z": ["n1", "n2"]}),
                                          lambda peer, ann, n=c.node: heard[n].append((peer, ann and ann.id)))
        await start(coords)
        try:
            signed = announcement(plan, "d@n3:1", "admin", "n3", time.time(), False, "drill-admin-token")
            etcd.put(f"{prefix}/{RACK}/drill/n3", node_doc("n3", signed, None), lease=etcd.lease_grant(120))
            await await_for(lambda: all(c.rejections.counts.get(("drill", "not_member"), 0) >= 1 for c in coords[:2]),
                            10, what="the planted drill document rejected")
            ch = coords[0].drill_channel
            ch.announce = announcement(plan, "d@n1:2", "admin", "n1", time.time(), False, "drill-admin-token")
            ch.publish()
            # each other agent's watch delivers it in its own time: wait for each (n3's lagged n2's under load)
            await await_for(lambda: all(("n1", "d@n1:2") in heard[n] for n in ("n2", "n3")), 10,
                            what="n2 and n3 hear n1's drill")
            await coords[0].stop()  # its lease revoked: its keys go
            await await_for(lambda: all(heard[n][-1] == ("n1", None) for n in ("n2", "n3")), 10,
                            what="n1's drill ended at n2 and n3")
            return heard
        finally:
            await stop(coords[1:])
    got = asyncio.run(run())
    assert got["n2"] == [("n1", "d@n1:2"), ("n1", None)]
    assert got["n3"] == [("n1", "d@n1:2"), ("n1", None)]  # taken everywhere: each agent decides if it is its own
    assert not [h for hs in got.values() for h in hs if h[0] == "n3"]
