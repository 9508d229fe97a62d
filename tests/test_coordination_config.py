"""The `coordination` section: refused when it cannot work, each error naming its field; absent = static."""

from __future__ import annotations

import pytest

from agent.config import ConfigError, parse_config
from agent.coordination import build_coordinator

INVENTORY = {"nodes": ["n1", "n2", "n3"],
             "leak_controllers": [{"name": "leak1", "profile": "rle-ld2100", "port": 1502}],
             "pdus": [{"name": "pdu-a", "profile": "raritan-pdu2", "port": 1161}]}


def _cfg(tmp_path, **coordination):
    data = {"agent": {"rack": "r1", "node": "n1", "state_dir": str(tmp_path)}, "inventory": INVENTORY}
    if coordination:
        data["coordination"] = coordination
    return data


def test_no_section_is_static_with_every_node_polling_and_the_first_node_leading(tmp_path):
    loaded = parse_config(_cfg(tmp_path))
    c = build_coordinator(loaded)
    assert c.backend == "static" and c.is_leader() and c.up()
    assert c.polling() == {"leak1": True, "pdu-a": True} and c.hidden() == frozenset()


def test_static_pollers_from_the_config(tmp_path):
    loaded = parse_config(_cfg(tmp_path, pollers={"leak1": ["n2", "n3"]}, peers={"n2": "http://127.0.0.1:9877"}))
    c = build_coordinator(loaded)
    assert c.polling() == {"leak1": False, "pdu-a": True}
    assert c.hidden() == frozenset({("leak", "leak1")})


@pytest.mark.parametrize("section, field", [
    ({"backend": "etcd"}, "coordination"),
    ({"pollers": {"leak1": ["n1", "n2", "n3"]}}, "coordination"),
    ({"pollers": {"nope": ["n1"]}}, "coordination.pollers.nope"),
    ({"pollers": {"leak1": ["n9"]}}, "coordination.pollers.leak1"),
    ({"pollers": {"leak1": ["n2"]}}, "n1 would never see it"),
    ({"pollers": {"leak1": ["n2"]}, "peers": {"n2": "127.0.0.1:9877"}}, "coordination: Value error, peers.n2"),
    ({"pollers": {"leak1": ["n2"]}, "peers": {"n2": "http://x:1", "n7": "http://y:1"}}, "coordination.peers.n7"),
    ({"backend": "etcd", "etcd": {"endpoints": ["127.0.0.1:2379"]}}, "coordination.etcd.endpoints"),
    ({"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:2379"]}, "pollers": {"leak1": ["n1"]}},
     "coordination"),
    ({"backend": "etcd", "lease_ttl_seconds": 0.1, "etcd": {"endpoints": ["http://127.0.0.1:2379"]}},
     "coordination.lease_ttl_seconds"),
])
def test_a_section_that_cannot_work_is_refused_naming_its_field(tmp_path, section, field):
    with pytest.raises(ConfigError) as err:
        parse_config(_cfg(tmp_path, **section))
    assert field in str(err.value), str(err.value)


def test_etcd_backend_builds_without_touching_etcd(tmp_path):
    loaded = parse_config(_cfg(tmp_path, backend="etcd", etcd={"endpoints": ["http://127.0.0.1:9"]}))
    c = build_coordinator(loaded)
    assert c.backend == "etcd" and not c.up() and not c.is_leader() and c.role() == "degraded"
    assert c.polling() == {"leak1": False, "pdu-a": False}
    assert c.hidden() == frozenset({("leak", "leak1"), ("pdu", "pdu-a")})
