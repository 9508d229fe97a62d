"""Nothing written to etcd can stop a leak response (issue 31): real agents, real etcd, the simulated rack.

The issue's first finding: one malformed value in `guard/drains` (or a string where `guard/actions` holds
a time), then a real leak, crashed the whole leak-response task on every node: no drain, no GPU cap, the
incident stuck at "mitigating". Here hypothesis writes garbage (bounded: a few examples, each a full leak
cycle on three agent processes) into every kind of rack key at once, then a real leak is injected in
zone-c: node03's own agent must drain node03 and cap its GPUs, every time.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.agentproc import AgentProcess
from tests.coordination_rack import etcd_rack, incidents, is_up, leaders, results
from tests.helpers import wait_for

NODES = ("node01", "node02", "node03")
TARGET, ZONE = "node03", "zone-c"
PREFIX = "/supernode-test"

# Every key kind of the rack (agent/coordination/etcd_rack.py), at names an attacker would pick.
KEYS = ["guard/drains", "guard/actions", "approvals/rack-000000000000", "approvals/rack-ffffffffffff",
        "facts/leak/leak1/ghost", "facts/leak/leak1/node01x", "facts/pdu/pdu-a/ghost", "leader", "members/ghost",
        "pollers/leak1/7", "maintenance/node03", "maintenance/ghost"]
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                                                         max_size=3),
                           max_leaves=12)
garbage = st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                    st.just(b'{"node03": 1e12, "x1": 1e12, "x2": 1e12}'),
                    st.just(b'{"recent": ["now"], "kinds": {"drain": [null]}, "breaker": {"open": true}}'))


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("trust-rack"))


def _leak_incident(agent: AgentProcess) -> dict | None:
    return next((i for i in incidents(agent).get("open", []) if i["detector"] == "leak"
                 and i["targets"].get("zone") == ZONE), None)


@settings(max_examples=20 if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else 3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.lists(garbage, min_size=len(KEYS), max_size=len(KEYS)))
def test_garbage_in_every_rack_key_never_stops_a_leak_drain_and_cap(rack, values):
    etcd, sim, agents = rack.etcd, rack.sim, rack.agents
    target = next(a for a in agents if a.config["agent"]["node"] == TARGET)
    rackname = target.config["agent"]["rack"]
    for key, value in zip(KEYS, values):
        etcd.put(f"{PREFIX}/{rackname}/{key}", value)
    sim.inject("leak", zone=ZONE)
    try:
        inc = wait_for(lambda: _leak_incident(target), 30, what="the leak open on node03's agent")
        wait_for(lambda: results(target, "drain", result="done", target=f"node={TARGET}", incident_id=inc["id"]), 30,
                 what="node03 drained by its own agent")
        wait_for(lambda: len(results(target, "gpu_power_cap", result="done", incident_id=inc["id"])) == 2, 30,
                 what="node03's two GPUs capped")
    finally:
        sim.clear()
        wait_for(lambda: _leak_incident(target) is None, 60, what="the leak resolved on node03")
    # The agents stay in the rack: the garbage was rejected, not obeyed nor fatal.
    wait_for(lambda: all(is_up(a) for a in agents) and len(leaders(agents)) == 1, 60, what="one leader again")
