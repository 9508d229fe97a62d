"""Config validation: each kind of bad input names its field; secrets never leak; examples are valid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, load_config, parse_config
from tests.helpers import REPO

SECRET = "s3cr3t-value-that-must-never-print"


def minimal(tmp_path: Path, **over) -> dict:
    tok = tmp_path / "admin.token"
    tok.write_text(SECRET + "\n")
    cfg = {"agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp_path / "state")},
           "listen": {"address": "127.0.0.1", "port": 0},
           "secrets": {"admin_token": {"file": str(tok)}}}
    for k, v in over.items():
        cfg[k] = v
    return cfg


def error_of(data, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "agent.yaml")
    return str(exc.value)


def test_minimal_config_loads_with_observe_default(tmp_path):
    loaded = parse_config(minimal(tmp_path))
    assert loaded.config.agent.mode == "observe"
    assert loaded.config.agent.event_loop == "asyncio"
    assert loaded.secret("admin_token").get_secret_value() == SECRET


@pytest.mark.parametrize("mutate, path, expect", [
    (lambda c: c["agent"].pop("rack"), "agent.rack", "required field missing"),
    (lambda c: c["agent"].update(mode="yolo"), "agent.mode", "observe"),
    (lambda c: c["agent"].update(event_loop="tokio"), "agent.event_loop", "uvloop"),
    (lambda c: c["listen"].update(address="0.0.0.0.1"), "listen.address", "expected an IP address"),
    (lambda c: c["listen"].update(port=70000), "listen.port", "less than or equal to 65535"),
    (lambda c: c.update(inventory={"gpus": {"count": "eight"}}), "inventory.gpus.count", "valid integer"),
    (lambda c: c.update(inventory={"gpu": {"count": 8}}), "inventory.gpu", "unknown field"),
    (lambda c: c.update(sources={"leak": {"interval": 0.5, "timeout": 5}}), "sources.leak", "more than 4 intervals"),
    (lambda c: c.update(sources={"cdu": {"interval": -1}}), "sources.cdu.interval", "greater than 0"),
    (lambda c: c.update(sources={"nvml": {"counters_interval": -5}}), "sources.nvml.counters_interval",
     "greater than or equal to 0"),
    (lambda c: c.update(sources={"links": {"counters_interval": "often"}}), "sources.links.counters_interval",
     "valid number"),
    (lambda c: c.update(inventory={"ports": [{"name": "eth0"}, {"name": "eth0"}]}), "inventory", "appears twice"),
    (lambda c: c.update(inventory={"nodes": ["node01"], "leak_zones": [{"name": "z", "nodes": ["node09"]}]}),
     "inventory", "not in inventory.nodes"),
    (lambda c: c.update(inventory={"ports": [{"name": "ib0", "kind": "fc"}]}), "inventory.ports.0.kind", "'ib' or 'eth'"),
    (lambda c: c.update(inventory={"pdus": [{"name": "p1", "profile": "raritan-pdu2", "request_timeout": 2,
                                             "retries": 2}]}), "inventory.pdus.p1", "exceeds sources.pdu.timeout"),
])
def test_bad_field_is_named(tmp_path, mutate, path, expect):
    assert_named(minimal(tmp_path), mutate, path, expect, tmp_path)


def assert_named(cfg: dict, mutate, path: str, expect: str, tmp_path: Path) -> None:
    """The config, once mutated, is refused with a message naming `path` and saying `expect`."""
    mutate(cfg)
    msg = error_of(cfg, tmp_path)
    assert path in msg, msg
    assert expect in msg, msg


@pytest.mark.parametrize("source", ["nvml", "links"])
@pytest.mark.parametrize("settings, every", [
    ({}, 1),  # the shipped 5 s interval: the counters every poll, as before
    ({"interval": 1.0, "timeout": 1.0}, 5),  # the demo's 1 s: every fifth poll
    ({"interval": 2.0, "counters_interval": 5.0}, 2),  # rounded to whole polls
    ({"interval": 1.0, "timeout": 1.0, "counters_interval": 0}, 1),
    ({"interval": 10.0, "counters_interval": 5.0}, 1),  # never less than every poll
])
def test_error_counters_are_read_every_whole_number_of_polls(tmp_path, source, settings, every):
    from agent.sources import _links, counters_every

    loaded = parse_config(minimal(tmp_path, sources={source: settings}, inventory={"ports": [{"name": "eth0"}]}))
    assert counters_every(getattr(loaded.config.sources, source)) == every
    if source == "links":  # and the link source is built with it
        assert [s.source.counters_every for s in _links(loaded) if s.source.name == "links"] == [every]


def test_secret_file_missing_is_named(tmp_path):
    cfg = minimal(tmp_path)
    cfg["secrets"]["webhook_token"] = {"file": str(tmp_path / "nope")}
    msg = error_of(cfg, tmp_path)
    assert "secrets.webhook_token.file" in msg and "nope" in msg


def test_pdu_secret_reference_must_exist(tmp_path):
    cfg = minimal(tmp_path, inventory={"pdus": [{"name": "p1", "profile": "raritan-pdu2",
                                                 "community_secret": "missing"}]})
    assert "inventory.pdus.p1.community_secret" in error_of(cfg, tmp_path)


def test_not_yaml_and_not_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_check_config_cli_exit_codes_and_redacted_dump(tmp_path):
    good = tmp_path / "agent.yaml"
    good.write_text(yaml.safe_dump(minimal(tmp_path)))
    cli = [sys.executable, "-m", "agent.cli", "check-config"]
    out = subprocess.run(cli + [str(good), "--dump"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout and SECRET not in out.stderr
    dump = json.loads(out.stdout)
    assert dump["secrets"]["admin_token"]["value"] == "<redacted>"
    bad_cfg = minimal(tmp_path)
    bad_cfg["inventory"] = {"gpus": {"count": -1}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bad_cfg))
    out = subprocess.run(cli + [str(bad)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 1
    assert "inventory.gpus.count" in out.stderr and "greater than or equal to 0" in out.stderr


def test_secret_repr_is_redacted(tmp_path):
    loaded = parse_config(minimal(tmp_path))
    assert SECRET not in repr(loaded.secrets)
    assert SECRET not in json.dumps(loaded.config.dump())


@pytest.mark.parametrize("example", sorted(p for p in (REPO / "examples").glob("*.yaml")
                                            if not p.name.startswith("drill-")), ids=lambda p: p.name)
def test_shipped_examples_validate(example, tmp_path):
    data = yaml.safe_load(example.read_text())
    # Point secret files at temp files: the examples name /etc paths that do not exist here.
    for i, ref in enumerate((data.get("secrets") or {}).values()):
        f = tmp_path / f"secret{i}"
        f.write_text("x")
        ref["file"] = str(f)
    parse_config(data, example.name)


@pytest.mark.parametrize("plan", sorted((REPO / "examples").glob("drill-*.yaml")), ids=lambda p: p.name)
def test_shipped_drill_plans_validate(plan):
    """examples/drill-*.yaml are drill plans (agent/drill/plan.py), not agent configs: each validates as one."""
    from agent.drill.plan import load_plan

    assert load_plan(plan).nodes


def test_playbooks_are_checked_with_the_config(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    cfg = minimal(tmp_path, remediation={"playbook_dir": str(books)})
    assert "no playbooks" in error_of(cfg, tmp_path)
    (books / "bad.yaml").write_text("name: x\ntrigger: {detector: leak}\nsteps: [{action: teleport}]\n")
    msg = error_of(cfg, tmp_path)
    assert "remediation.playbook_dir" in msg and "bad.yaml" in msg and "steps.0.action" in msg, msg
    cfg["remediation"]["playbook_dir"] = str(tmp_path / "missing")
    assert "not a directory" in error_of(cfg, tmp_path)



def test_a_partial_source_section_keeps_that_sources_own_defaults(tmp_path):
    """`leak: {timeout: 0.3}` must not slow leak polling to the generic 5 s (nor `dom:` speed DOM up to it)."""
    from agent.config import load_config

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({"agent": {"rack": "r1", "node": "n1", "state_dir": str(tmp_path / "state")},
                                   "sources": {"leak": {"timeout": 0.3}, "dom": {"concurrency": 2},
                                               "pdu": {"interval": 10}}}))
    s = load_config(cfg).config.sources
    assert (s.leak.interval, s.leak.timeout, s.leak.max_backoff) == (0.5, 0.3, 2.0)
    assert (s.dom.interval, s.dom.timeout) == (30.0, 10.0)
    assert (s.pdu.interval, s.pdu.timeout) == (10, 3.0)


def test_pdu_profile_auto_is_accepted_and_a_typo_still_is_not(tmp_path):
    loaded = parse_config(minimal(tmp_path, inventory={"pdus": [{"name": "p1", "profile": "auto"}]}))
    assert loaded.config.inventory.pdus[0].profile == "auto"
    assert "no profile 'autp'" in error_of(minimal(tmp_path, inventory={"pdus": [{"name": "p1", "profile": "autp"}]}),
                                           tmp_path)


SNMP_CDU = {"name": "cdu2", "protocol": "snmp", "profile": "apc-inrow-rc", "channels": {1: "z"}}


@pytest.mark.parametrize("entry, path, expect", [
    ({**SNMP_CDU, "unit": 3}, "inventory.cdus.0", "unit: a Modbus unit id; an SNMP CDU has none"),
    ({"name": "cdu2", "profile": "reference-cdu", "community_secret": "c"}, "inventory.cdus.0",
     "community_secret: SNMP only (this CDU's protocol is modbus)"),
    ({**SNMP_CDU, "protocol": "bacnet-ish"}, "inventory.cdus.0.protocol", "'modbus', 'snmp' or 'bacnet'"),
    ({**SNMP_CDU, "profile": "apc-rpdu2"}, "inventory.cdus.cdu2.profile", "is a pdu profile; this entry needs a cdu"),
    ({**SNMP_CDU, "profile": "reference-cdu"}, "inventory.cdus.cdu2.profile", "no profile 'reference-cdu'"),
    ({**SNMP_CDU, "community_secret": "missing"}, "inventory.cdus.cdu2.community_secret", "not in secrets"),
    ({**SNMP_CDU, "request_timeout": 1.5, "retries": 1}, "inventory.cdus.cdu2", "exceeds sources.cdu.timeout"),
    ({**SNMP_CDU, "version": "1"}, "inventory.cdus.0.version", "'2c' or '3'"),
])
def test_snmp_cdu_entry_is_checked_naming_the_field(tmp_path, entry, path, expect):
    cfg = minimal(tmp_path, inventory={"leak_zones": [{"name": "z"}], "cdus": [entry]})
    assert_named(cfg, lambda c: None, path, expect, tmp_path)


def test_snmp_cdu_builds_its_loop_and_leak_sources_and_refuses_a_valve(tmp_path):
    from agent.sources import build_sources

    inv = {"leak_zones": [{"name": "z"}], "cdus": [{**SNMP_CDU, "host": "127.0.0.1", "version": "3",
                                                     "v3_user": "u", "v3_auth_secret": "admin_token"}]}
    loaded = parse_config(minimal(tmp_path, inventory=inv))
    cdu = loaded.config.inventory.cdus[0]
    assert (cdu.protocol, cdu.port) == ("snmp", 161)
    built = {(s.source.name, s.source.device): s.source for s in build_sources(loaded) if s.source.name != "nvml"}
    assert set(built) == {("cdu", "cdu2"), ("leak", "cdu2")}
    assert built[("leak", "cdu2")].leak_sensors() == [("z", "inrow-leak")]
    assert built[("cdu", "cdu2")].client.where == "127.0.0.1:161"
    # an SNMP CDU has no writable points: a zone valve on it is refused at load
    inv["leak_zones"][0]["valve"] = "cdu2:valve"
    msg = error_of(minimal(tmp_path, inventory=inv), tmp_path)
    assert "inventory.leak_zones.z.valve" in msg and "speaks snmp: it has no writable control points" in msg


def test_check_config_warns_of_an_open_host_header_on_a_routable_listener(tmp_path):
    """DNS rebinding reaches a listener on a routable address that accepts any Host: check-config says so (the
    loopback and an allowed_hosts list are quiet); the default still loads, so Prometheus scrapes keep working."""
    cli = [sys.executable, "-m", "agent.cli", "check-config"]

    def stderr_for(address: str, allowed_hosts: list[str] | None = None) -> str:
        cfg = minimal(tmp_path)
        cfg["listen"] = {"address": address, "port": 0, **({"allowed_hosts": allowed_hosts} if allowed_hosts else {})}
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = subprocess.run(cli + [str(path)], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    for address in ("0.0.0.0", "10.1.2.3", "::"):
        err = stderr_for(address)
        assert f"warning: listen.allowed_hosts is not set while listening on {address}" in err, err
    for quiet in (stderr_for("127.0.0.1"), stderr_for("::1"), stderr_for("10.1.2.3", ["node01.example"])):
        assert "allowed_hosts" not in quiet, quiet


def test_the_daemon_runs_on_the_event_loop_its_config_names():
    """agent.event_loop: asyncio's own loop (the default), or uvloop's."""
    import asyncio

    import uvloop

    from agent.daemon import _loop_factory

    assert _loop_factory("asyncio") is None
    factory = _loop_factory("uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
