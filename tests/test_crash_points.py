"""SIGKILL of the real daemon at every crash point of a drain: before its effect, after its effect but before
its result, and the same two points of its undo (the resume). The restarted daemon reconciles against a real
slurmctld and the node ends exactly where it should: drained once while the incident is open, resumed once it
resolved."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import textwrap

import pytest

from tests.agentproc import AgentProcess, base_config
from tests.helpers import require_binary, wait_for
from tests.slurm import node_states, running_cluster

WEBHOOK = "crash-points-webhook-token"
ADMIN = "admin-token-for-tests"

# scontrol wrapper: logs each call; WRAP_HANG=<drain|resume>-<before|after> hangs around the real call ("after":
# once the real call has returned, which it logs, so the test kills the agent only when the effect is in Slurm).
WRAPPER = textwrap.dedent("""\
    import os, subprocess, sys, time
    mode = os.environ.get("WRAP_HANG", "")
    word = {"drain": "State=DRAIN", "resume": "State=RESUME"}.get(mode.split("-")[0], "-")
    hit = word in sys.argv
    with open(os.environ["WRAP_LOG"], "a") as f:
        f.write(" ".join(sys.argv[1:]) + f" pid={os.getpid()}\\n")
    if hit and mode.endswith("before"):
        time.sleep(120)
    rc = subprocess.run([os.environ["REAL_SCONTROL"], *sys.argv[1:]]).returncode
    if hit and mode.endswith("after"):
        with open(os.environ["WRAP_LOG"], "a") as f:
            f.write(f"returned {mode} rc={rc} pid={os.getpid()}\\n")
        time.sleep(120)
    sys.exit(rc)
""")


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"])


def xid_alert(status: str) -> dict:
    alert = {"status": status, "labels": {"alertname": "SupernodeGpuLost", "detector": "gpu_lost",
                                          "node": "node01", "severity": "critical"},
             "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "xid-node01"}
    return {"version": "4", "status": status, "receiver": "agent", "groupKey": "{}", "alerts": [alert]}


def journal_count(state_dir, sql: str) -> int:
    """COUNT(*) of `sql` over the agent's journal; 0 while the journal is not there yet or is being created."""
    path = state_dir / "journal.db"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchone()[0]
    except sqlite3.Error:  # the agent is still creating the table
        return 0
    finally:
        db.close()


def journal_has(state_dir, sql: str) -> bool:
    return journal_count(state_dir, sql) > 0


def incident_state(agent: AgentProcess) -> str | None:
    status, body = agent.get("/api/v1/incidents", token=ADMIN)
    assert status == 200, (status, body[:300])
    data = json.loads(body)
    return next((i["state"] for i in data["open"] + data["recent"] if i["detector"] == "gpu_lost"), None)


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


CRASH_POINTS = ["drain-before", "drain-after", "resume-before", "resume-after"]


@pytest.mark.parametrize("crash", CRASH_POINTS)
def test_sigkill_at_each_crash_point_then_restart_converges(cluster, tmp_path, crash):
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")
    wait_for(lambda: node_states(cluster).get("node01") == "idle", 30, what="node01 idle at the start")
    wrapper, log, state = tmp_path / "scontrol", tmp_path / "calls.log", tmp_path / "state"
    wrapper.write_text(f"#!{sys.executable}\n" + WRAPPER)
    wrapper.chmod(0o755)
    (tmp_path / "webhook.token").write_text(WEBHOOK + "\n")
    cfg = base_config(tmp_path)
    cfg["agent"].update(state_dir=str(state), mode="enforce")
    cfg["secrets"]["webhook_token"] = {"file": str(tmp_path / "webhook.token")}
    cfg["inventory"] = {"nodes": ["node01", "node02"]}
    cfg["remediation"] = {"slurm": {"scontrol": str(wrapper), "slurm_conf": str(cluster.conf), "timeout_seconds": 60},
                          # no NVML here to check the GPUs before a resume: this test is about crashes, so
                          # the resume is automatic (the resume check is tested in test_judgement.py)
                          "guardrails": {"max_drained_fraction": 1.0, "cooldown_seconds": 0,
                                         "retry_backoff_seconds": 0.05, "automatic": ["resume_after_check"]}}
    env = {"WRAP_LOG": str(log), "REAL_SCONTROL": require_binary("scontrol")}
    word, when = crash.split("-")
    first = AgentProcess(cfg, tmp_path, env={**env, "WRAP_HANG": crash}).start()
    try:
        assert first.request("POST", "/api/v1/alerts", xid_alert("firing"), token=WEBHOOK)[0] == 200
        if word == "resume":
            wait_for(lambda: incident_state(first) == "mitigated", 30, what="mitigated before the undo")
            assert first.request("POST", "/api/v1/alerts", xid_alert("resolved"), token=WEBHOOK)[0] == 200
        phase = "undo" if word == "resume" else "apply"
        wait_for(lambda: any(f"State={word.upper()}" in c for c in calls(log))
                 and journal_has(state, "SELECT COUNT(*) FROM journal WHERE kind='intent' AND action='drain'"
                                        f" AND json_extract(detail, '$.phase')='{phase}'"),
                 30, what=f"{word} issued and its intent durable")
        if when == "after":
            wait_for(lambda: any(c.startswith(f"returned {crash} rc=0") for c in calls(log)), 30,
                     what=f"the real {word} returned")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
        for line in calls(log):  # the wrapper left hanging by the kill
            try:
                os.kill(int(line.rsplit("pid=", 1)[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    expected = "idle" if crash in ("drain-before", "resume-after") else "drained"
    wait_for(lambda: node_states(cluster).get("node01") == expected, 15, what=f"node01 {expected} after the kill")

    second = AgentProcess(cfg, tmp_path, env=env)
    second.log_path = tmp_path / "agent2.log"
    second.start()
    try:
        if word == "drain":
            # reconciled (after: done, no second drain; before: failed, drained by the re-run), still ours
            wait_for(lambda: incident_state(second) == "mitigated", 30, what="mitigated after the restart")
            assert node_states(cluster)["node01"] == "drained"
            drains = [c for c in calls(log) if "State=DRAIN" in c]
            assert len(drains) == (1 if when == "after" else 2), drains
            assert second.request("POST", "/api/v1/alerts", xid_alert("resolved"), token=WEBHOOK)[0] == 200
        # the undo happens: from the resolved alert, or (killed during undo) from the journal on restart
        wait_for(lambda: node_states(cluster).get("node01") == "idle", 30, what="node01 resumed by the agent")
        # Slurm says idle as soon as the resume lands; the agent journals the result once it has read it back.
        wait_for(lambda: journal_has(state, "SELECT COUNT(*) FROM journal WHERE kind='result' AND action='drain'"
                                            " AND result='undone'"), 30, what="the undo's result journaled")
        # The interrupted step, reconciled by what Slurm says: an effect that landed is recorded done/undone and
        # not repeated; one that did not is recorded failed and run again, once.
        step = f"FROM journal WHERE action='drain' AND json_extract(detail, '$.phase')='{phase}'"
        intents = journal_count(state, f"SELECT COUNT(*) {step} AND kind='intent'")
        failed = journal_count(state, f"SELECT COUNT(*) {step} AND kind='result' AND result='failed'")
        assert (intents, failed) == ((2, 1) if when == "before" else (1, 0))
        # Resumed once: a resume that landed before the kill is not repeated; one that did not is, once.
        resumes = [c for c in calls(log) if "State=RESUME" in c]
        assert len(resumes) == (2 if crash == "resume-before" else 1), resumes
    finally:
        second.stop()
