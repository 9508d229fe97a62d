"""A real agent process against the simulated rack: live /metrics, staleness, independence of sources, the demo."""

from __future__ import annotations

import re
import signal
import subprocess
import shutil
import sys
import tempfile
import urllib.request

import pytest

from sim.demo import agent_config
from tests.agentproc import running_agent
from tests.helpers import REPO, free_port, require_binary, wait_for
from sim.harness import sim_rack


def _series(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _up(text: str, source: str, device: str) -> float | None:
    m = re.search(rf'^supernode_source_up{{device="{re.escape(device)}",source="{source}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture
def rack_agent(tmp_path):
    with sim_rack(tmp_path) as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 20, what="every source polled once")
            yield rack, agent


def test_live_metrics_pass_promtool_and_cover_every_gpu(rack_agent):
    promtool = require_binary("promtool")
    rack, agent = rack_agent
    sources = [("nvml", "gpus"), ("links", "node01"), ("dom", "node01"), ("cdu", "cdu1"), ("leak", "leak1"),
               ("pdu", "pdu-a"), ("derived", "rack_power")]
    wait_for(lambda: all(_up(agent.metrics(), s, d) == 1.0 for s, d in sources), 20, what="every source up")
    text = agent.metrics()
    out = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out
    gpus = rack.sim.model.nodes["node01"].gpus
    for g in gpus:
        assert _series(text, f'supernode_gpu_power_watts{{gpu="{g.index}",uuid="{g.uuid}"}}'), g.uuid
    assert 'supernode_agent_info{mode="observe",node="node01",rack="r01"' in text


def test_a_dead_cdu_goes_stale_without_touching_other_sources(rack_agent):
    rack, agent = rack_agent
    wait_for(lambda: _up(agent.metrics(), "cdu", "cdu1") == 1.0, 20, what="cdu1 up")
    # Only what is logged from here on counts (a slow start may have had a failure streak of its own).
    log_start = len(agent.log().splitlines())
    rack.inject("cdu-offline", device="cdu1")
    # Down at once, series gone after two missed intervals; the other CDU and the GPUs keep reporting.
    wait_for(lambda: _up(agent.metrics(), "cdu", "cdu1") == 0.0
             and not _series(agent.metrics(), 'supernode_cdu_temperature_celsius{cdu="cdu1"'), 15,
             what="cdu1 down and its series dropped")
    text = agent.metrics()
    assert _series(text, 'supernode_cdu_temperature_celsius{cdu="rdhx1"')
    assert _up(text, "nvml", "gpus") == 1.0 and _series(text, "supernode_gpu_power_watts{")
    assert re.search(r'^supernode_source_errors_total\{device="cdu1",kind="(connection|timeout)",source="cdu"\} [1-9]',
                     text, re.M)
    failures = re.findall(r'^supernode_source_errors_total\{device="cdu1",kind="\w+",source="cdu"\} (\S+)$', text, re.M)
    assert sum(float(n) for n in failures) >= 2  # it kept failing...

    def failed_lines() -> list[str]:
        return [l for l in agent.log().splitlines()[log_start:] if 'event="source failed"' in l
                and "device=cdu1" in l and "source=cdu " in l + " "]
    assert len(failed_lines()) == 1, failed_lines()  # ...but said so once
    rack.clear()
    wait_for(lambda: _series(agent.metrics(), 'supernode_cdu_temperature_celsius{cdu="cdu1"'), 20,
             what="cdu1 back by itself")
    assert any('event="source recovered"' in l and "device=cdu1" in l for l in agent.log().splitlines())


def test_demo_serves_every_gpu_and_stops_cleanly_on_ctrl_c(tmp_path):
    env = {"SUPERNODE_SIM_FILE": str(tmp_path / "sim.json"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           # a short TMPDIR: the demo's Slurm puts munged's socket under it (a Unix socket path has 108 bytes)
           "PYTHONUNBUFFERED": "1", "TMPDIR": tempfile.mkdtemp(prefix="demo-", dir="/tmp")}
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "demo", "--duration", "120"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        urls = [l.split()[1] for l in lines if l.startswith("metrics: ")]
        assert len(urls) == 2, "".join(lines)
        assert any(l.startswith("sim: http://127.0.0.1:") for l in lines)
        assert any(l.startswith("webhook-token: ") for l in lines)
        for url in urls:
            def gpu_series() -> int:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return len(_series(resp.read().decode(), "supernode_gpu_power_watts{"))
            wait_for(lambda: gpu_series() == 4, 20, what=f"4 GPUs on {url}")
        _demo_xid48_story(lines)
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(20) == 0, rest
        assert "demo stopped" in rest
        for url in urls:  # every agent it started is gone
            with pytest.raises(OSError):
                urllib.request.urlopen(url, timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)


def _demo_xid48_story(lines: list[str]) -> None:
    """The demo's GPU reset story (issue 33): a job per node keeps its GPUs busy; a held XID 48 drains node01,
    the drain's checkpoint signal ends its job, the GPUs go idle, the agent resets the GPU and resumes the node."""
    from agent.httpclient import request_json

    conf = next(re.search(r"SLURM_CONF=(\S+)", l).group(1) for l in lines if l.startswith("slurm: SLURM_CONF="))
    sim = next(l.split()[1] for l in lines if l.startswith("sim: "))
    env = {"SLURM_CONF": conf, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}

    def jobs() -> dict[str, str]:
        out = subprocess.run(["squeue", "-h", "-o", "%N %j %T"], capture_output=True, text=True, env=env, timeout=10)
        return {f[0]: f[2] for f in (l.split() for l in out.stdout.splitlines()) if len(f) == 3}

    wait_for(lambda: jobs() == {"node01": "RUNNING", "node02": "RUNNING"}, 30, what="a demo job on each node")

    def held() -> list:
        status, body = request_json("GET", f"{sim}/api/v1/state")
        assert status == 200, body
        return body["nodes"]["node01"]["gpus"][1]["xid_faults"]
    status, body = request_json("POST", f"{sim}/api/v1/inject", {"kind": "xid", "params": {
        "node": "node01", "gpu": "1", "code": "48", "sticky": "true"}})
    assert status == 200 and held(), body
    try:
        wait_for(lambda: not held(), 90, what="node01's GPU 1 reset by its agent once its job checkpointed and left")
    except AssertionError:
        work = next(l.split()[-1] for l in lines if l.startswith("logs and configs: "))
        journal = subprocess.run([sys.executable, "-m", "agent.cli", "--config", f"{work}/node01/agent.yaml", "journal"],
                                 capture_output=True, text=True, cwd=REPO, timeout=30)
        print("node01's journal and Slurm's queue at the failure:", journal.stdout[-4000:], jobs())
        raise
    wait_for(lambda: jobs().get("node01") == "RUNNING", 60, what="node01 resumed and running a new demo job")


def test_first_wet_reading_is_confirmed_at_once_not_a_poll_later(tmp_path):
    """Two consecutive wet polls, but the second is an immediate re-read: a leak acts within one interval."""
    import json

    interval = 30.0  # the next timed poll is 30 s away: a confirmation before it can only be the re-read
    with sim_rack(tmp_path) as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce")
        cfg["sources"]["leak"] = {"interval": interval, "timeout": 1.0}
        cfg["remediation"]["slurm"] = {"backend": "simulated"}
        rack.inject("leak", zone="zone-a")  # wet before the agent's first poll
        with running_agent(cfg, tmp_path) as agent:
            def leak_incident() -> bool:
                status, body = agent.get("/api/v1/incidents", token="token-for-tests")
                return status == 200 and any(i["detector"] == "leak" for i in json.loads(body)["open"])

            # Two consecutive wet polls are required; the first is the start-up poll, and the second must be
            # the immediate re-read, since the scheduled one is an interval away (waited for well short of it).
            wait_for(leak_incident, interval / 2, interval=0.05, what="leak incident confirmed by the re-read")


def test_demo_leak_story_through_the_cli(tmp_path):
    """Leak -> the node's GPUs capped and node drained at once -> valve waits for `approve` -> journal shows it."""
    import os

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(tmp_path / "agent.yaml"), *args],
                              capture_output=True, text=True, cwd=REPO, timeout=30, env=dict(os.environ))

    with sim_rack(tmp_path) as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce")
        cfg["remediation"]["slurm"] = {"backend": "simulated"}
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 20, what="agent ready")
            rack.inject("leak", zone="zone-a")
            gpus = rack.sim.model.nodes["node01"].gpus
            wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 10, what="zone GPUs capped")
            out = wait_for(lambda: (o := cli("incidents")).returncode == 0 and "cdu_write" in o.stdout and o, 10,
                           what="valve step pending approval")
            incident = re.search(r"^(leak-\w+)\s+leak\s+zone=zone-a", out.stdout, re.M).group(1)
            assert "mitigating" in out.stdout or "mitigated" in out.stdout
            assert rack.sim.model.coolant.valve_open["zone-a"] is True  # nothing closes without a person
            approved = cli("approve", incident)
            assert approved.returncode == 0 and "approved" in approved.stdout, approved.stderr
            wait_for(lambda: rack.sim.model.coolant.valve_open["zone-a"] is False, 10, what="valve closed")
            journal = cli("journal")
            assert journal.returncode == 0
            for action in ("gpu_power_cap", "drain", "cdu_write"):
                assert re.search(rf"\bintent\b.*\b{action}\b", journal.stdout), action
                assert re.search(rf"\bresult\s+done\b.*\b{action}\b", journal.stdout), action
            assert cli("approve", "no-such-id").returncode == 1
            # The leak is a failure of node01's tray, in the reliability report read from the same journal.
            report = cli("report", "--since", "1d")
            assert report.returncode == 0, report.stderr
            assert re.search(r"^node\s+1\s+1\s+\d", report.stdout, re.M), report.stdout
            assert re.search(r"^node\s+node01\s+1\s+.*still open", report.stdout, re.M), report.stdout
            # The agent's log tells the same story as a timeline, one decision per line: each chain in order
            # (the playbook's steps run side by side, so the chains interleave).
            events = [m.group(1) for m in re.finditer(r'logger=supernode\.decision event="([^"]+)"', agent.log())]
            for chain in (["incident open", "drain intent", "drain done"],
                          ["incident open", "gpu_power_cap intent", "gpu_power_cap done"],
                          ["incident open", "approval pending", "approval approved", "cdu_write intent",
                           "cdu_write done"]):
                assert set(chain) <= set(events), events
                first = [events.index(e) for e in chain]
                assert first == sorted(first), (chain, events)


def test_a_stop_while_a_poll_waits_on_a_slow_device_logs_no_error(tmp_path):
    """SIGTERM while polls wait on a slow CDU: the agent stops, exits 0 and logs no error (the poll it abandons
    is no failure of the device, and a traceback on every restart teaches operators to ignore errors)."""
    with sim_rack(tmp_path) as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        cfg["sources"]["cdu"] = {"interval": 1.0, "timeout": 4.0}
        cfg["sources"]["leak"] = {"interval": 1.0, "timeout": 4.0}
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 20, what="every source polled once")
            device = rack.sim.devices["cdu1"]
            rack.inject("cdu-slow", device="cdu1", ms=3000)
            seen = device.requests
            wait_for(lambda: device.requests > seen, 10, what="a request waiting on the slow CDU")
            agent.signal(signal.SIGTERM)
            assert agent.proc.wait(10) == 0, agent.log()[-3000:]
        log = agent.log()
        assert 'event="agent stopped"' in log
        errors = [line for line in log.splitlines() if "level=error" in line]
        assert not errors, "\n".join(errors)[:3000]
