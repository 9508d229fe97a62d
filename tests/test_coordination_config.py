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


def _with_urls(data, **urls):
    return dict(data, inventory=dict(data["inventory"], agent_urls=urls))


def test_static_pollers_from_the_config(tmp_path):
    loaded = parse_config(_with_urls(_cfg(tmp_path, pollers={"leak1": ["n2", "n3"]}), n2="http://127.0.0.1:9877"))
    c = build_coordinator(loaded)
    assert c.polling() == {"leak1": False, "pdu-a": True}
    assert c.hidden() == frozenset({("leak", "leak1")})
    assert c.needed_peers() == ["n2"] and c.peers == {"n2": "http://127.0.0.1:9877"}
    assert loaded.warnings == []


def test_coordination_peers_is_an_alias_of_inventory_agent_urls_with_a_warning(tmp_path):
    """One fact, one place: the old setting still works, folded into inventory.agent_urls (what the status page
    reads too), and the operator is told to move it; the same for its CA."""
    (tmp_path / "ca.pem").write_text("not read here\n")
    data = _with_urls(_cfg(tmp_path, pollers={"leak1": ["n2", "n3"]}, peers={"n2": "http://127.0.0.1:9877"},
                           peers_ca_file=str(tmp_path / "ca.pem")), n3="http://127.0.0.1:9878")
    loaded = parse_config(data)
    assert loaded.config.inventory.agent_urls == {"n2": "http://127.0.0.1:9877", "n3": "http://127.0.0.1:9878"}
    assert loaded.config.status.peer_tls.ca_file == tmp_path / "ca.pem"
    c = build_coordinator(loaded)
    assert c.needed_peers() == ["n2", "n3"]
    assert any(w.startswith("coordination.peers is deprecated") and "inventory.agent_urls" in w
               for w in loaded.warnings), loaded.warnings
    assert any(w.startswith("coordination.peers_ca_file is deprecated") and "status.peer_tls.ca_file" in w
               for w in loaded.warnings), loaded.warnings
    # the same URL in both places is one fact said twice: accepted, still warned about
    same = parse_config(_with_urls(_cfg(tmp_path, pollers={"leak1": ["n2"]}, peers={"n2": "http://127.0.0.1:9877"}),
                                   n2="http://127.0.0.1:9877"))
    assert same.config.inventory.agent_urls == {"n2": "http://127.0.0.1:9877"} and same.warnings


def test_two_urls_for_one_peer_are_refused_naming_both(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config(_with_urls(_cfg(tmp_path, pollers={"leak1": ["n2"]}, peers={"n2": "http://127.0.0.1:1"}),
                                n2="http://127.0.0.1:2"))
    assert "coordination.peers.n2" in str(err.value) and "inventory.agent_urls.n2" in str(err.value), str(err.value)
    data = _cfg(tmp_path, pollers={"leak1": ["n2"]}, peers={"n2": "http://127.0.0.1:1"}, peers_ca_file="/a.pem")
    data["status"] = {"peer_tls": {"ca_file": "/b.pem"}}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert "coordination.peers_ca_file" in str(err.value) and "status.peer_tls.ca_file" in str(err.value)


@pytest.mark.parametrize("section, field", [
    ({"backend": "etcd"}, "coordination"),
    ({"pollers": {"leak1": ["n1", "n2", "n3"]}}, "coordination"),
    ({"pollers": {"nope": ["n1"]}}, "coordination.pollers.nope"),
    ({"pollers": {"leak1": ["n9"]}}, "coordination.pollers.leak1"),
    ({"pollers": {"leak1": ["n2"]}}, "inventory.agent_urls has no URL of its pollers (n2): n1 would never see it"),
    ({"pollers": {"leak1": ["n2"]}, "peers": {"n2": "127.0.0.1:9877"}}, "coordination: Value error, peers.n2"),
    ({"pollers": {"leak1": ["n2"]}, "peers": {"n2": "http://x:1", "n7": "http://y:1"}}, "coordination.peers.n7"),
    ({"backend": "etcd", "etcd": {"endpoints": ["127.0.0.1:2379"]}}, "coordination.etcd.endpoints"),
    ({"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:2379"]}, "pollers": {"leak1": ["n1"]}},
     "coordination"),
    ({"backend": "etcd", "lease_ttl_seconds": 0.1, "etcd": {"endpoints": ["http://127.0.0.1:2379"]}},
     "coordination.lease_ttl_seconds"),
    ({"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:2379"], "user": "r1.n1"}},
     "coordination.etcd: Value error, user needs password_secret"),
    ({"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:2379"], "password_secret": "etcd_pw"}},
     "coordination.etcd.password_secret: secret 'etcd_pw' not in secrets"),
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


def test_the_etcd_user_defaults_to_the_nodes_own_and_its_password_comes_from_the_secret_file(tmp_path):
    """One agent.yaml for the rack: each node authenticates as <rack>.<node>, the user `etcd-roles` made for it."""
    (tmp_path / "etcd.password").write_text("s3cret\n")
    data = dict(_cfg(tmp_path, backend="etcd", etcd={"endpoints": ["http://127.0.0.1:9"],
                                                     "password_secret": "etcd_pw"}),
                secrets={"etcd_pw": {"file": str(tmp_path / "etcd.password")}})
    for node in ("n1", "n3"):
        client = build_coordinator(parse_config(data, node=node)).client
        assert (client.user, client._password) == (f"r1.{node}", "s3cret")
    data["coordination"]["etcd"]["user"] = "agent-n1"
    assert build_coordinator(parse_config(data)).client.user == "agent-n1"
    del data["coordination"]["etcd"]["password_secret"], data["coordination"]["etcd"]["user"]
    assert build_coordinator(parse_config(data)).client.user is None  # anonymous: etcd without auth
