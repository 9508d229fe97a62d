"""The CLI as an operator uses it: probes against the simulated devices, fault injection, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sim.demo import agent_config
from tests.helpers import REPO, free_port, require_binary
from sim.harness import SimRack


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    work = tmp_path_factory.mktemp("clirack")
    rack = SimRack(work).start()
    # The simulator advertises itself here so `supernode-sim inject` finds it without --sim.
    (work / "sim.json").write_text(json.dumps({"url": rack.url}))
    rack.discovery = work / "sim.json"
    yield rack
    rack.stop()


def cli(*args: str, env: dict[str, str] | None = None, module: str = "agent.cli") -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=60)


def sim_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`supernode-sim ARGS`, the simulator's own command."""
    return cli(*args, env=env, module="sim.cli")


def endpoint(rack, name: str) -> str:
    host, port = rack.sim.devices[name].endpoint
    return f"{host}:{port}"


def promtool_ok(text: str) -> None:
    out = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True)
    assert out.returncode == 0 and not out.stdout.strip(), out


@pytest.mark.parametrize("device, profile, metric", [
    ("cdu1", "reference-cdu", "supernode_cdu_temperature_celsius"),
    ("rdhx1", "vertiv-liebert-dcd", "supernode_cdu_temperature_celsius"),
    ("leak1", "rle-ld2100", "supernode_leak_detected"),
])
def test_probe_modbus_prints_the_exposition(rack, device, profile, metric):
    out = cli("probe", "modbus", "--profile", profile, "--target", endpoint(rack, device))
    assert out.returncode == 0, out.stderr
    assert f"\n{metric}{{" in out.stdout
    promtool_ok(out.stdout)


def test_probe_modbus_errors_are_clear(rack):
    dead = f"127.0.0.1:{free_port()}"
    out = cli("probe", "modbus", "--profile", "reference-cdu", "--target", dead, "--timeout", "0.5")
    assert out.returncode == 1 and dead.split(":")[1] in out.stderr and out.stdout == ""
    out = cli("probe", "modbus", "--profile", "no-such-profile", "--target", endpoint(rack, "cdu1"))
    assert out.returncode == 1 and "no-such-profile" in out.stderr


def test_probe_snmp_against_the_simulated_pdu(rack):
    out = cli("probe", "snmp", "--profile", "raritan-pdu2", "--target", endpoint(rack, "pdu-a"))
    assert out.returncode == 0, out.stderr
    assert "\nsupernode_pdu_inlet_power_watts{" in out.stdout and "\nsupernode_pdu_outlet_power_watts{" in out.stdout
    promtool_ok(out.stdout)
    out = cli("probe", "snmp", "--profile", "raritan-pdu2", "--target", f"127.0.0.1:{free_port()}",
              "--timeout", "0.3", "--retries", "0")
    assert out.returncode == 1 and "timeout" in out.stderr


def test_probe_links_and_nvml_from_a_config(rack, tmp_path):
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text("t\n")
    cfg_path = tmp_path / "agent.yaml"
    cfg_path.write_text(yaml.safe_dump(agent_config(rack.sim, "node02", free_port(), tmp_path)))
    out = cli("--config", str(cfg_path), "probe", "links")
    assert out.returncode == 0, out.stderr
    assert '\nsupernode_link_up{kind="ib",port="mlx5_0/1"} 1.0' in out.stdout
    assert "\nsupernode_optic_rx_power_dbm{" in out.stdout
    out = cli("probe", "nvml", "--sim", rack.url, "--node", "node02", "--expect-gpus", "4")
    assert out.returncode == 0, out.stderr
    uuids = {g.uuid for g in rack.sim.model.nodes["node02"].gpus}
    assert all(f'uuid="{u}"' in out.stdout for u in uuids)


def test_sim_inject_finds_the_simulator_and_names_bad_parameters(rack):
    env = {"SUPERNODE_SIM_FILE": str(rack.discovery)}
    out = sim_cli("inject", "workload", "--ratio", "2", env=env)
    assert out.returncode == 1 and "ratio" in out.stderr
    out = sim_cli("inject", "xid", "--node", "node01", env=env)
    assert out.returncode == 1 and "'code' is required" in out.stderr
    out = sim_cli("inject", "nosuchfault", env=env)
    assert out.returncode == 1 and "unknown fault" in out.stderr
    out = sim_cli("inject", "workload", "--node", "node02", "--ratio", "0.5", env=env)
    assert out.returncode == 0, out.stderr
    assert {g.workload for g in rack.sim.model.nodes["node02"].gpus} == {0.5}
    out = sim_cli("clear", env=env)
    assert out.returncode == 0
    assert {g.workload for g in rack.sim.model.nodes["node02"].gpus} == {0.85}
    out = sim_cli("state", env={"SUPERNODE_SIM_FILE": str(rack.discovery.with_name("missing.json"))})
    assert out.returncode == 2 and "no running simulator" in out.stderr


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path):
    """`supernode-agent incidents | head -1`: a closed pipe ends the listing quietly, no traceback."""
    import os

    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    # The listing itself stands in for an agent's long answer: it writes more than a pipe buffer holds.
    code = ("import sys; import agent.remediation.cli as rc; from agent.cli import main; "
            "rc.dispatch = lambda args: [print('x' * 100000, flush=True) for _ in range(3)] and 0; "
            "sys.exit(main(['incidents']))")
    proc = subprocess.run([sys.executable, "-c", code], stdout=w, stderr=subprocess.PIPE, text=True, cwd=REPO,
                          timeout=60)
    os.close(w)
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr


def test_the_cli_works_in_the_daemons_environment_without_docstrings(tmp_path):
    """The unit runs every command (ExecStartPre's check-config, the daemon) under PYTHONOPTIMIZE=2, where
    docstrings are None: a command that built its help from one must still start."""
    from agent.memory import DAEMON_ENV

    assert cli("--help", env=dict(DAEMON_ENV)).returncode == 0
    (tmp_path / "admin.token").write_text("t0ken\n")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump({
        "agent": {"rack": "r01", "node": "node01", "state_dir": str(tmp_path / "state")},
        "listen": {"address": "127.0.0.1", "port": 0},
        "secrets": {"admin_token": {"file": str(tmp_path / "admin.token")}}}))
    check = cli("check-config", str(tmp_path / "agent.yaml"), env=dict(DAEMON_ENV))
    assert check.returncode == 0 and ": ok (" in check.stdout, check.stdout + check.stderr
    import os

    rules = subprocess.run([sys.executable, "-m", "agent.remediation.alert_rules", "--check"], capture_output=True,
                           text=True, cwd=REPO, env={**os.environ, **DAEMON_ENV}, timeout=60)
    assert rules.returncode == 0, rules.stderr
    probe = subprocess.run([sys.executable, "-c", "import sys; print(sys.flags.optimize)"], capture_output=True,
                           text=True, env={**os.environ, **DAEMON_ENV})
    assert probe.stdout.strip() == "2"  # the variable really takes effect: the commands above ran at level 2


def test_demo_cdu_protocol_is_a_choice_of_the_four_protocols_a_cdu_speaks():
    out = sim_cli("demo", "--cdu-protocol", "profibus")
    assert out.returncode == 2 and "invalid choice: 'profibus'" in out.stderr
    assert all(p in out.stderr for p in ("modbus", "redfish", "snmp", "bacnet"))
