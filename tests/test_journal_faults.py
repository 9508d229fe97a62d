"""The journal under its own faults, with the real daemon: a full state disk, a corrupt or unopenable file.

A full disk is a real one: a small tmpfs mounted as `state_dir` (we are root) and filled to ENOSPC,
then emptied. Nothing here waits on time: every wait is for a condition with a deadline.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

from tests.agentproc import base_config, running_agent
from tests.helpers import fill_filesystem, wait_for

WEBHOOK = "journal-faults-webhook-token"


def leak_config(tmp_path: Path, state_dir: Path, mode: str = "enforce") -> dict:
    (tmp_path / "webhook.token").write_text(WEBHOOK + "\n")
    cfg = base_config(tmp_path)
    cfg["agent"].update(state_dir=str(state_dir), mode=mode)
    cfg["secrets"]["webhook_token"] = {"file": str(tmp_path / "webhook.token")}
    cfg["inventory"] = {"nodes": ["node01", "node02"],
                        "leak_zones": [{"name": "zone-a", "nodes": ["node01"]}]}
    cfg["remediation"] = {"slurm": {"backend": "simulated"},
                          "guardrails": {"max_drained_fraction": 1.0, "retry_backoff_seconds": 0.01}}
    return cfg


def leak_alert(status: str = "firing") -> dict:
    alert = {"status": status, "labels": {"alertname": "SupernodeLeakDetected", "detector": "leak", "zone": "zone-a",
                                          "rack": "r01", "severity": "critical"},
             "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "leak-zone-a"}
    return {"version": "4", "status": status, "receiver": "agent", "groupKey": "{}", "alerts": [alert]}


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def sample(text: str, prefix: str) -> float | None:
    return next((float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix)), None)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs: a state disk we can fill for real."""
    mnt = tmp_path / "state"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (needs root): {out.stderr}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


class WatchdogListener:
    """Counts WATCHDOG=1 datagrams on a NOTIFY_SOCKET, on its own thread."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.pings = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                if self.sock.recv(256) == b"WATCHDOG=1":
                    self.pings += 1
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


def test_full_state_disk_never_loses_the_leak_playbook_nor_blocks_the_loop(tmp_path, small_tmpfs):
    watchdog = WatchdogListener(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
    try:
        with running_agent(leak_config(tmp_path, small_tmpfs), tmp_path, env=env) as agent:
            wait_for(lambda: metric(agent.metrics(), "supernode_journal_writable") == 1, 20, what="journal open")
            filler = fill_filesystem(small_tmpfs)
            pings = watchdog.pings
            status, body = agent.request("POST", "/api/v1/alerts", leak_alert(), token=WEBHOOK)
            assert status == 200 and json.loads(body)["accepted"] == 1, body
            # the drain ran although nothing could be written; the rows wait in memory
            wait_for(lambda: sample(agent.metrics(), 'supernode_remediation_actions_total{action="drain",'
                                                     'playbook="leak-response",result="done"}') == 1,
                     30, what="drain done with the disk full")
            # the writer thread may not have tried the disk yet when the drain is done: wait for its refusal
            wait_for(lambda: metric(agent.metrics(), "supernode_journal_writable") == 0, 20,
                     what="the journal writer refused by the full disk")
            text = agent.metrics()
            assert metric(text, "supernode_journal_errors_total") >= 1
            assert metric(text, "supernode_journal_pending_entries") >= 2  # incident, intent, result...
            # the loop kept answering and pinging the watchdog while the disk refused
            wait_for(lambda: watchdog.pings >= pings + 3, 20, what="watchdog pings with the disk full")
            status, body = agent.get("/api/v1/journal", token="admin-token-for-tests")
            assert status == 200
            queued = json.loads(body)["entries"]
            assert [e["result"] for e in queued if e["kind"] == "result" and e["action"] == "drain"] == ["done"]
            # a retry of the same alert is a duplicate (the engine accepted it): nothing runs twice
            status, body = agent.request("POST", "/api/v1/alerts", leak_alert(), token=WEBHOOK)
            assert status == 200 and json.loads(body)["duplicates"] == 1
            # room again: every queued row lands, in order
            filler.unlink()
            wait_for(lambda: metric(agent.metrics(), "supernode_journal_pending_entries") == 0, 30,
                     what="queued rows flushed")
            assert metric(agent.metrics(), "supernode_journal_writable") == 1
            db = sqlite3.connect(f"file:{small_tmpfs / 'journal.db'}?mode=ro", uri=True)
            rows = db.execute("SELECT kind, action, result FROM journal ORDER BY seq").fetchall()
            alerts = db.execute("SELECT fingerprint FROM webhook_alerts").fetchall()
            db.close()
            assert ("incident", None, "open") in rows and ("intent", "drain", None) in rows
            assert rows.index(("intent", "drain", None)) < rows.index(("result", "drain", "done"))
            assert alerts == [("leak-zone-a",)]
    finally:
        watchdog.close()


def test_corrupt_journal_is_moved_aside_and_the_agent_keeps_serving(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.db").write_bytes(b"this is not an SQLite database, a disk ate it" * 100)
    with running_agent(leak_config(tmp_path, state, mode="observe"), tmp_path) as agent:
        wait_for(lambda: metric(agent.metrics(), "supernode_journal_moved_aside") == 1, 20, what="moved aside")
        moved = list(state.glob("journal.db.corrupt-*"))
        assert len(moved) == 1 and moved[0].read_bytes().startswith(b"this is not an SQLite")
        status, body = agent.get("/readyz")
        assert json.loads(body)["remediation"]["ok"] is True  # a fresh journal: remediation runs
        assert metric(agent.metrics(), "supernode_remediation_degraded") == 0
        assert "journal unreadable: moved aside" in agent.log()
        status, body = agent.get("/api/v1/journal", token="admin-token-for-tests")
        assert any(e["kind"] == "journal" and e["result"] == "moved_aside" for e in json.loads(body)["entries"])


def test_unopenable_journal_degrades_remediation_not_the_agent(tmp_path):
    state = tmp_path / "state"
    (state / "journal.db").mkdir(parents=True)  # a directory where the file should be: sqlite cannot open it
    with running_agent(leak_config(tmp_path, state), tmp_path) as agent:
        wait_for(lambda: agent.get("/readyz")[0] == 200, 20, what="ready")
        ready = json.loads(agent.get("/readyz")[1])
        assert ready["remediation"]["ok"] is False and "journal" in ready["remediation"]["degraded"]
        assert metric(agent.metrics(), "supernode_remediation_degraded") == 1
        # an alert cannot be accepted now: 5xx, so Alertmanager keeps it and retries
        status, _ = agent.request("POST", "/api/v1/alerts", leak_alert(), token=WEBHOOK)
        assert status == 503
        assert agent.proc.poll() is None and "remediation not started" in agent.log()


def test_remediation_import_failure_is_said_not_silent(tmp_path, monkeypatch):
    import sys

    from agent.config import load_config
    from agent.daemon import Agent
    from tests.agentproc import AgentProcess

    proc = AgentProcess(base_config(tmp_path), tmp_path)
    proc.write_config(proc.config)
    monkeypatch.setitem(sys.modules, "agent.remediation.wiring", None)  # import raises ImportError
    agent = Agent(load_config(proc.config_path))
    assert agent.remediation is None
    assert "agent.remediation.wiring" in agent.remediation_degraded()
    assert b"supernode_remediation_degraded 1.0" in agent.render_metrics()


def test_corrupt_journal_full_disk_and_hung_gpu_during_a_leak_still_drain_node01(tmp_path, small_tmpfs):
    """The three faults at once, on the simulated rack with a real agent: node01 is drained, /metrics answers."""
    from sim.demo import agent_config
    from tests.helpers import free_port
    from sim.harness import sim_rack

    (small_tmpfs / "journal.db").write_bytes(b"\x00garbage, not SQLite" * 200)
    with sim_rack(tmp_path / "rack") as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("admin-token-for-tests\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce")
        cfg["agent"]["state_dir"] = str(small_tmpfs)
        cfg["remediation"]["slurm"] = {"backend": "simulated"}
        cfg["remediation"]["device_timeout_seconds"] = 1.0
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: metric(agent.metrics(), "supernode_journal_moved_aside") == 1, 20, what="moved aside")
            fill_filesystem(small_tmpfs)
            rack.inject("gpu-hang", node="node01", gpu=1, seconds=60)
            rack.inject("leak", zone="zone-a")
            try:
                wait_for(lambda: sample(agent.metrics(), 'supernode_remediation_actions_total{action="drain",'
                                                         'playbook="leak-response",result="done"}') == 1,
                         30, what="node01 drained with all three faults")
                status, body = agent.get("/api/v1/journal", token="admin-token-for-tests")
                drained = [e for e in json.loads(body)["entries"] if e["kind"] == "result" and e["action"] == "drain"]
                assert drained[0]["target"] == "node=node01" and drained[0]["result"] == "done"
                assert metric(agent.metrics(), "supernode_journal_writable") == 0
            finally:
                rack.clear()  # ends the hang, so the agent stops promptly
