"""The daemon as a process: health, reload (atomic), tokens, systemd notify, clean stop."""

from __future__ import annotations

import copy
import json
import signal
import socket
import time

from tests.agentproc import base_config, running_agent
from tests.helpers import wait_for

TOKEN = "admin-token-for-tests"


def test_health_ready_and_metrics(tmp_path):
    with running_agent(base_config(tmp_path), tmp_path) as agent:
        assert agent.get("/healthz")[0] == 200
        assert agent.get("/readyz")[0] == 200  # no sources: nothing to wait for
        text = agent.metrics()
        assert 'supernode_agent_info{mode="observe",node="node01",rack="r01",role="compute"' in text
        state = agent.state()
        assert state["agent"]["node"] == "node01"
        assert TOKEN not in json.dumps(state)


def test_reload_keeps_running_config_on_bad_file_and_applies_good_one(tmp_path):
    cfg = base_config(tmp_path)
    with running_agent(cfg, tmp_path) as agent:
        agent.write_config("agent: {rack: r01, node: \"\"}\n")  # node empty
        agent.signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in agent.log(), 10, what="refused reload logged")
        assert "agent.node" in agent.log()
        assert agent.state()["config"]["agent"]["node"] == "node01"
        assert agent.get("/healthz")[0] == 200

        # The API needs the admin token and reports the refusal with the field path.
        status, body = agent.request("POST", "/-/reload")
        assert status == 401
        status, body = agent.request("POST", "/-/reload", token="wrong")
        assert status == 401
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 400 and b"agent.node" in body

        good = copy.deepcopy(cfg)
        good["agent"]["role"] = "gpu-tray"
        agent.write_config(good)
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 200, body
        assert agent.state()["config"]["agent"]["role"] == "gpu-tray"
        assert 'role="gpu-tray"' in agent.metrics()
        assert TOKEN not in agent.log()


def test_sigterm_stops_within_5s_and_notifies_systemd(tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(10)
    try:
        agent_ctx = running_agent(base_config(tmp_path), tmp_path,
                                  env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000"})
        with agent_ctx as agent:
            messages = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not ({"READY=1", "WATCHDOG=1"} <= set(messages)):
                messages.append(sock.recv(256).decode())
            assert "READY=1" in messages and "WATCHDOG=1" in messages, messages
            agent.signal(signal.SIGTERM)
            rc = agent.proc.wait(5)  # the unit's stop deadline: TimeoutExpired fails the test
            assert rc == 0, agent.log()
            assert "agent stopped" in agent.log()
    finally:
        sock.close()


def test_reload_swaps_remediation_settings_and_rotates_tokens(tmp_path):
    cfg = base_config(tmp_path)
    cfg["inventory"] = {"nodes": ["node01"]}
    cfg["remediation"] = {"slurm": {"backend": "simulated"}}
    with running_agent(cfg, tmp_path) as agent:
        def incidents(token: str) -> tuple[int, dict]:
            status, body = agent.get("/api/v1/incidents", token=token)
            return status, (json.loads(body) if status == 200 else {})

        assert incidents(TOKEN)[1]["mode"] == "observe"
        # A playbook directory that does not exist: the whole reload is refused, nothing changes.
        bad = copy.deepcopy(cfg)
        bad["agent"]["mode"] = "enforce"
        bad["remediation"]["playbook_dir"] = str(tmp_path / "no-such-dir")
        agent.write_config(bad)
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 400 and b"no-such-dir" in body, body
        assert incidents(TOKEN)[1]["mode"] == "observe"

        # Enforce mode, a tighter guardrail and a rotated admin token, applied without a restart.
        good = copy.deepcopy(cfg)
        good["agent"]["mode"] = "enforce"
        good["remediation"]["guardrails"] = {"max_drained_nodes": 1}
        agent.write_config(good)
        (tmp_path / "admin.token").write_text("rotated-token\n")
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 200, body
        assert incidents(TOKEN)[0] == 401
        status, data = incidents("rotated-token")
        assert status == 200 and data["mode"] == "enforce"
        assert 'supernode_remediation_mode{mode="enforce"} 1.0' in agent.metrics()
        assert "rotated-token" not in agent.log()


def test_start_failures_name_the_setting(tmp_path):
    import socket
    import subprocess
    import sys

    import yaml

    from tests.helpers import REPO

    def start(cfg) -> subprocess.CompletedProcess:
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(path), "run"], cwd=REPO,
                              capture_output=True, text=True, timeout=30)

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    cfg = base_config(tmp_path)
    cfg["agent"]["state_dir"] = str(blocker / "state")
    out = start(cfg)
    assert out.returncode == 2 and "agent.state_dir" in out.stderr and "Traceback" not in out.stderr, out.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = base_config(tmp_path)
        cfg["listen"]["port"] = taken.getsockname()[1]
        out = start(cfg)
    assert out.returncode == 2 and "listen.port" in out.stderr and "Traceback" not in out.stderr, out.stderr
