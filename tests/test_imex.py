"""IMEX (issue 34): nvidia-imex-ctl's output parsed from the profile's samples and refused when bad, the source
run against the simulator's stand-in for the tool (a real program), and the real daemon exporting the state and
following an injected IMEX fault.

The samples are written from NVIDIA's documentation (exporters/profiles/imex/samples/README.md); each assertion
here reads what that documentation says the tool prints.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from exporters.imex.imex import (DomainStatus, ImexOutputError, ImexSource, domain_readings, load_profile,
                                 parse_domain, parse_query)
from exporters.model import SourceError
from sim.imex import SimImexDomain
from sim.rack import RackModel
from tests.helpers import REPO, free_port, wait_for

SAMPLES = Path(__file__).resolve().parent.parent / "exporters" / "profiles" / "imex" / "samples"
PROFILE = load_profile()


def _sample(name: str) -> str:
    return (SAMPLES / name).read_text()


# -- the parser on the samples -----------------------------------------------------------------------------------


def test_query_samples_read_the_daemon_state():
    assert parse_query(_sample("q-ready.txt")) == "READY"
    assert parse_query(_sample("q-waiting.txt")) == "WAITING_FOR_PEERS"


def test_domain_up_sample_reads_every_node_ready_and_connected():
    d = parse_domain(_sample("N-j-H-up.json"))
    assert d.state == "UP"
    assert d.nodes == {f"node0{i}": "READY" for i in range(1, 5)}
    assert d.connections["CONNECTED"] == 16 and sum(d.connections.values()) == 16


def test_domain_degraded_sample_names_the_node_whose_daemon_is_down():
    d = parse_domain(_sample("N-j-H-degraded.json"))
    assert d.state == "DEGRADED"
    assert [peer for peer, s in d.nodes.items() if s != "READY"] == ["node03"]
    assert d.nodes["node03"] == "UNAVAILABLE"
    assert d.connections["INVALID"] == 7 and d.connections["CONNECTED"] == 9


def test_domain_down_sample():
    d = parse_domain(_sample("N-j-H-down.json"))
    assert d.state == "DOWN" and set(d.nodes.values()) == {"UNAVAILABLE"}


def test_readings_are_state_sets():
    readings = domain_readings(parse_domain(_sample("N-j-H-degraded.json")))
    domain = {r.labels["state"]: r.value for r in readings if r.name == "supernode_imex_domain_state"}
    assert domain == {"UP": 0.0, "DEGRADED": 1.0, "DOWN": 0.0}
    node03 = {r.labels["status"]: r.value for r in readings
              if r.name == "supernode_imex_domain_node_status" and r.labels["peer"] == "node03"}
    assert set(node03) == set(PROFILE.daemon_states) and sum(node03.values()) == 1 and node03["UNAVAILABLE"] == 1


def test_a_node_without_a_host_name_is_named_by_its_ip():
    data = json.loads(_sample("N-j-H-up.json"))
    data["nodes"]["1"]["hostName"] = "N/A"
    del data["nodes"]["2"]["hostName"]
    d = parse_domain(json.dumps(data))
    assert "10.114.0.12" in d.nodes and "10.114.0.13" in d.nodes and "node01" in d.nodes


def test_an_unknown_connection_spelling_is_counted_as_other():
    data = json.loads(_sample("N-j-H-up.json"))
    data["nodes"]["0"]["connections"]["1"]["status"] = "SOMETHING_NEW"
    assert parse_domain(json.dumps(data)).connections["other"] == 1


# -- bad output: a clear error naming the field or line ----------------------------------------------------------


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("status"), "field status missing"),
    (lambda d: d.update(status="SIDEWAYS"), "field status: unknown domain state 'SIDEWAYS'"),
    (lambda d: d.update(nodes=[]), "field nodes must be a dict"),
    (lambda d: d["nodes"]["1"].pop("status"), "field nodes.1.status missing"),
    (lambda d: d["nodes"]["2"].update(status="ASLEEP"), "field nodes.2.status: unknown node state 'ASLEEP'"),
    (lambda d: d["nodes"]["3"].pop("host"), "field nodes.3.host missing"),
    (lambda d: d["nodes"]["0"]["connections"]["2"].update(status=7), "field nodes.0.connections.2.status must be a str"),
    (lambda d: d["nodes"]["1"].update(hostName="node01"), "field nodes.1: node 'node01' listed twice"),
])
def test_bad_domain_output_names_the_field(edit, field):
    data = json.loads(_sample("N-j-H-up.json"))
    edit(data)
    with pytest.raises(ImexOutputError) as err:
        parse_domain(json.dumps(data))
    assert field in str(err.value)


def test_domain_output_that_is_not_json_names_the_line():
    with pytest.raises(ImexOutputError, match=r"not JSON \(line 2"):
        parse_domain('{"status": "UP",\n  nodes: {}}')
    with pytest.raises(ImexOutputError, match="expected an object, got list"):
        parse_domain("[]")


def test_bad_query_output_names_the_line():
    with pytest.raises(ImexOutputError, match=r"line 1: unknown daemon state 'BUSY'"):
        parse_query("BUSY\n")
    with pytest.raises(ImexOutputError, match="expected one line with the daemon state, got 2 lines"):
        parse_query("READY\nREADY\n")
    with pytest.raises(ImexOutputError, match="got 0 lines"):
        parse_query("")


# -- the source against a program --------------------------------------------------------------------------------


def _stand_in(tmp_path: Path, nodes: int = 3) -> SimImexDomain:
    dom = SimImexDomain(RackModel(nodes=nodes, gpus_per_node=1), tmp_path / "imex")
    asyncio.run(dom.start())
    return dom


def _values(readings, name: str, key: str, **labels: str) -> dict[str, float]:
    return {r.labels[key]: r.value for r in readings
            if r.name == name and all(r.labels.get(k) == v for k, v in labels.items())}


def _current(readings, name: str, key: str, **labels: str) -> str:
    on = [k for k, v in _values(readings, name, key, **labels).items() if v == 1.0]
    assert len(on) == 1, on
    return on[0]


def test_source_reads_the_stand_in_and_follows_its_faults(tmp_path):
    dom = _stand_in(tmp_path)
    source = ImexSource([sys.executable, "-m", "sim.imex_ctl", str(dom.root), "node01"], timeout=20)
    result = asyncio.run(source.poll())
    assert not result.partial_errors
    assert _current(result.readings, "supernode_imex_daemon_state", "state") == "READY"
    assert _current(result.readings, "supernode_imex_domain_state", "state") == "UP"
    assert {p: _current(result.readings, "supernode_imex_domain_node_status", "status", peer=p)
            for p in ("node01", "node02", "node03")} == dict.fromkeys(("node01", "node02", "node03"), "READY")

    dom.set_down("node02")
    dom.set_lost("node01", "node03")
    dom.write_files()
    result = asyncio.run(source.poll())
    assert _current(result.readings, "supernode_imex_daemon_state", "state") == "READY"  # node01's own is up
    assert _current(result.readings, "supernode_imex_domain_state", "state") == "DEGRADED"
    assert _current(result.readings, "supernode_imex_domain_node_status", "status", peer="node02") == "UNAVAILABLE"
    conns = _values(result.readings, "supernode_imex_domain_connections", "status")
    assert conns["INVALID"] == 5 and conns["DISCONNECTED"] == 2 and conns["CONNECTED"] == 2

    own = ImexSource([sys.executable, "-m", "sim.imex_ctl", str(dom.root), "node02"], timeout=20)
    assert _current(asyncio.run(own.poll()).readings, "supernode_imex_daemon_state", "state") == "UNAVAILABLE"


def test_a_missing_binary_is_the_source_down_naming_it(tmp_path):
    source = ImexSource([str(tmp_path / "no-such" / "nvidia-imex-ctl")])
    with pytest.raises(SourceError) as err:
        asyncio.run(source.poll())
    assert err.value.kind == "config"
    assert "nvidia-imex-ctl" in str(err.value) and "not found" in str(err.value)


def test_a_failing_tool_is_a_driver_error_with_its_message(tmp_path):
    dom = _stand_in(tmp_path)
    (dom.root / "domain.json").unlink()  # the command service unreachable
    source = ImexSource([sys.executable, "-m", "sim.imex_ctl", str(dom.root), "node01"], timeout=20)
    with pytest.raises(SourceError) as err:
        asyncio.run(source.poll())
    assert err.value.kind == "driver" and "cannot read the IMEX domain state" in str(err.value)


def test_output_beyond_the_bound_is_refused_and_the_tool_killed(tmp_path):
    pidfile = tmp_path / "pid"
    flood = (f"import os, sys; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
             "[sys.stdout.write('R' * 65536) for _ in range(1000)]")
    source = ImexSource([sys.executable, "-c", flood], timeout=20, max_bytes=100_000)
    with pytest.raises(SourceError) as err:
        asyncio.run(source.poll())
    assert err.value.kind == "decode" and "output exceeds 100000 bytes" in str(err.value)
    pids = [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []
    for pid in pids:  # the flooding tool does not outlive the poll
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_hung_tool_times_out_and_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    hang = f"import os, time; open({str(pidfile)!r}, 'a').write(str(os.getpid()) + ' '); time.sleep(600)"
    source = ImexSource([sys.executable, "-c", hang], timeout=3)
    with pytest.raises(SourceError) as err:
        asyncio.run(source.poll())
    assert err.value.kind == "timeout" and "no answer within 3.0s" in str(err.value)
    for pid in (int(p) for p in pidfile.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_one_query_failing_leaves_the_other_standing(tmp_path):
    dom = _stand_in(tmp_path)
    # A tool that answers -N but not -q: the domain's readings stand, the poll carries a partial error.
    script = tmp_path / "half.py"
    script.write_text(f"import sys, runpy\nsys.path.insert(0, {str(REPO)!r})\n"
                      "if sys.argv[-1] == '-q':\n    sys.exit('command service: no answer')\n"
                      f"sys.argv = ['imex_ctl', {str(dom.root)!r}, 'node01', *sys.argv[1:]]\n"
                      "runpy.run_module('sim.imex_ctl', run_name='__main__')\n")
    source = ImexSource([sys.executable, str(script)], timeout=20)
    result = asyncio.run(source.poll())
    assert result.partial_errors == {"driver": 1}
    assert _current(result.readings, "supernode_imex_domain_state", "state") == "UP"
    assert not _values(result.readings, "supernode_imex_daemon_state", "state")


def test_domain_status_has_no_nodes_beyond_the_bound():
    nodes = {str(i): {"status": "READY", "host": f"10.0.{i // 250}.{i % 250}", "connections": {}}
             for i in range(600)}
    with pytest.raises(ImexOutputError, match="field nodes: 600 nodes, more than 576"):
        parse_domain(json.dumps({"status": "UP", "nodes": nodes}))
    assert isinstance(parse_domain(json.dumps({"status": "UP", "nodes": {}})), DomainStatus)


# -- the real daemon ---------------------------------------------------------------------------------------------


def _series(text: str, family: str, **labels: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(rf"^{family}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            out[m.group(1)] = float(m.group(2))
    return out


def _on(text: str, family: str, key: str, **labels: str) -> set[str]:
    return {dict(re.findall(r'(\w+)="([^"]*)"', k))[key] for k, v in _series(text, family, **labels).items()
            if v == 1.0}


def test_agent_exports_imex_and_an_injected_fault_flips_it(tmp_path):
    from sim.demo import agent_config
    from sim.harness import sim_rack
    from tests.agentproc import running_agent

    with sim_rack(tmp_path, nodes=3, gpus=1, personality="gb200") as rack:
        (tmp_path / "admin.token").write_text("token-for-tests\n")
        (tmp_path / "webhook.token").write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        assert cfg["sources"]["imex"]["enabled"]  # the demo's GB200 trays run the source
        cfg["sources"]["imex"].update(interval=1.0, timeout=4.0)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: _on(agent.metrics(), "supernode_imex_domain_state", "state") == {"UP"}, 60,
                     what="the IMEX domain reads UP")
            text = agent.metrics()
            assert _on(text, "supernode_imex_daemon_state", "state") == {"READY"}
            assert _on(text, "supernode_imex_domain_node_status", "peer", status="READY") == {"node01", "node02",
                                                                                               "node03"}
            assert list(_series(text, "supernode_source_up", source="imex").values()) == [1.0]

            rack.inject("imex-down", node="node03")
            wait_for(lambda: _on(agent.metrics(), "supernode_imex_domain_state", "state") == {"DEGRADED"}, 60,
                     what="the IMEX domain reads DEGRADED after imex-down on node03")
            text = agent.metrics()
            assert _on(text, "supernode_imex_domain_node_status", "peer", status="UNAVAILABLE") == {"node03"}
            assert _on(text, "supernode_imex_daemon_state", "state") == {"READY"}

            rack.clear()
            rack.inject("imex-peer-down", node="node01", peer="node02")
            wait_for(lambda: list(_series(agent.metrics(), "supernode_imex_domain_connections",
                                          status="DISCONNECTED").values()) == [2.0], 60,
                     what="the lost node01 <-> node02 connection counted both ways")
            assert _on(agent.metrics(), "supernode_imex_domain_node_status", "peer", status="UNAVAILABLE") == set()
