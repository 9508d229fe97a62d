"""Issue 16: the engine's judgement in a cluster that looks like production, with the real daemon and Slurm.

Other racks with drained nodes (extra nodes in the private Slurm), Slurm
unreachable (sinfo/scontrol wrappers that fail while a flag file exists),
agents restarted and reloaded mid-incident, a person's maintenance.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from sim.demo import agent_config
from tests.agentproc import running_agent
from tests.helpers import REPO, free_port, require_binary, wait_for
from sim.harness import sim_rack
from tests.slurm import SlurmCluster, node_states

TOKEN = "token-for-tests"
RACK = ["node01", "node02"]      # the simulated rack (its inventory)
OTHER_RACK = ["node03", "node04"]  # another rack in the same Slurm cluster


@pytest.fixture(scope="module")
def cluster():
    for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
        require_binary(b)
    c = SlurmCluster(names=RACK + OTHER_RACK).start()
    yield c
    c.cleanup()


@pytest.fixture
def clean_cluster(cluster):
    yield cluster
    for n in RACK + OTHER_RACK:
        cluster.scontrol("update", f"NodeName={n}", "State=RESUME")


def _tokens(tmp_path: Path) -> None:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")


def _journal(agent, **match: str) -> list[dict]:
    status, body = agent.get("/api/v1/journal?limit=2000", token=TOKEN)
    assert status == 200, body
    return [e for e in json.loads(body)["entries"] if all(e.get(k) == v for k, v in match.items())]


def _incidents(agent) -> dict:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    assert status == 200, body
    return json.loads(body)




def _reason(cluster: SlurmCluster, node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"], capture_output=True, text=True,
                         env=cluster.env, timeout=10)
    return out.stdout.strip()


# -- 1: blast radius counts only this rack's nodes --------------------------------------------------


def test_other_racks_drained_nodes_do_not_block_this_racks_drain(clean_cluster, tmp_path):
    cluster = clean_cluster
    for n in OTHER_RACK:  # another rack under maintenance: two drained nodes the agent must not count
        assert cluster.scontrol("update", f"NodeName={n}", "State=DRAIN", "Reason=rack r02 pump swap").returncode == 0
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        _tokens(tmp_path)
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
        cfg["remediation"]["guardrails"].update(max_drained_nodes=1, max_drained_fraction=1.0, cooldown_seconds=0)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("xid", node="node01", gpu=0, code=48)  # a DBE: reset class, drained through gpu_reset_required
            wait_for(lambda: node_states(cluster).get("node01") in ("drained", "draining"), 30,
                     what=f"node01 drained (journal: {_journal(agent, kind='blocked')})")
            assert _reason(cluster, "node01").startswith("supernode-agent:")
            assert not _journal(agent, kind="blocked", action="drain")
            # A person drains node02 (this rack): now a second drain in the rack is over max_drained_nodes=1,
            # and the block names the rack's nodes it counted, not the other rack's.
            assert cluster.scontrol("update", "NodeName=node01", "State=RESUME").returncode == 0
            assert cluster.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=bob: fan").returncode == 0
            xid = [i for i in _incidents(agent)["open"] if i["targets"].get("gpu") == "0"]  # not a load's leak_source_down
            assert len(xid) == 1, _incidents(agent)["open"]
            status, _ = agent.request("POST", "/api/v1/incidents/" + xid[0]["id"] + "/reject", token=TOKEN)
            assert status == 200
            rack.inject("gpu-lost", node="node01", gpu=1)
            rows = wait_for(lambda: _journal(agent, kind="blocked", action="drain"), 30, what="drain blocked")
            why = rows[0]["detail"]["why"]
            assert rows[0]["detail"]["guardrail"] == "blast_radius"
            assert "node02" in why and "max_drained_nodes is 1" in why
            assert not any(n in why for n in OTHER_RACK), why
            assert node_states(cluster)["node01"] == "idle"


# -- 3: Slurm unreachable is a blocked, retried step; the rest of the playbook still runs ---------------


def _failing_wrapper(path: Path, real: str, flag: Path) -> str:
    path.write_text(f"#!/bin/sh\nif [ -e '{flag}' ]; then echo 'slurm_load_partitions: Unable to contact slurm "
                    f"controller (connect failure)' >&2; exit 1; fi\nexec '{real}' \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_slurm_unreachable_blocks_the_drain_retries_it_and_the_leak_playbook_goes_on(clean_cluster, tmp_path):
    cluster = clean_cluster
    flag = tmp_path / "slurm-down"
    flag.write_text("")
    sinfo = _failing_wrapper(tmp_path / "sinfo", require_binary("sinfo"), flag)
    scontrol = _failing_wrapper(tmp_path / "scontrol", require_binary("scontrol"), flag)
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        _tokens(tmp_path)
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
        cfg["remediation"]["slurm"].update(sinfo=sinfo, scontrol=scontrol)
        cfg["remediation"]["guardrails"].update(retry_backoff_seconds=0.2)
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("leak", zone="zone-a")
            gpus = rack.sim.model.nodes["node01"].gpus
            wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 20, what="zone GPUs capped")
            # Independent steps happen although the drain cannot: the valve waits for approval, notify says
            # it is not configured, and the drain is blocked with its reason, retried.
            pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "cdu_write"],
                               20, what="valve close pending approval")
            assert agent.request("POST", f"/api/v1/incidents/{pending[0]['id']}/approve", token=TOKEN)[0] == 200
            wait_for(lambda: rack.sim.model.coolant.valve_open["zone-a"] is False, 20, what="valve closed")
            wait_for(lambda: _journal(agent, action="notify", result="not_configured"), 20, what="notify recorded")
            blocked = wait_for(lambda: len(_journal(agent, kind="blocked", action="drain")) >= 2 and
                               _journal(agent, kind="blocked", action="drain"), 20, what="drain blocked, retried")
            assert {b["detail"]["guardrail"] for b in blocked} == {"scheduler_unreachable"}
            assert "Unable to contact slurm controller" in blocked[0]["detail"]["why"]
            assert "retry in" in blocked[0]["detail"]["why"]
            assert node_states(cluster)["node01"] == "idle"
            flag.unlink()  # slurmctld answers again: the retry drains the node
            wait_for(lambda: _journal(agent, kind="result", action="drain", result="done"), 30, what="drain done")
            assert node_states(cluster).get("node01") in ("drained", "draining")
            log = agent.log()  # the step's failure is a decision line, not a remediation task's traceback
            assert "remediation task failed" not in log
            assert re.search(r'event="drain blocked".*guardrail=scheduler_unreachable', log), log[-3000:]


# -- 2: restart and reload resume the world; a person can resolve or reject ----------------------------


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(tmp_path / "agent.yaml"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=30, env=dict(os.environ))


def _config(rack, tmp_path: Path, slurm_conf: Path | None = None, **detectors) -> dict:
    """node01's agent in enforce mode, no cooldown, these detector holds; the simulated scheduler unless given Slurm."""
    _tokens(tmp_path)
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=slurm_conf)
    cfg["remediation"]["guardrails"]["cooldown_seconds"] = 0
    cfg["remediation"]["detectors"] = detectors
    # None of these tests is about a hung GPU (test_nvml_hang.py, test_nvml_lanes.py, test_remediation_hung_gpu.py
    # are): give each GPU's reads 2 s, so a read the suite's load makes slower than the shipped 0.5 s at the agent's
    # start is not a hung GPU, whose gpu_lost drain (once it stays hung past detectors.gpu_lost_hung_fire_seconds)
    # would stand in for the drain a test is about (seen once, before that hold existed: test_fabric_resume's drain
    # waited for was gpu_lost's, and its resume never came)
    cfg["sources"]["nvml"].update(timeout=3.0, gpu_timeout=2.0)
    return cfg


@contextmanager
def _rack_agent(tmp_path: Path, **detectors):
    """A 2x2 simulated rack and node01's agent on it: (rack, agent, node01's GPUs, their default limit)."""
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        gpus = rack.sim.model.nodes["node01"].gpus
        with running_agent(_config(rack, tmp_path, **detectors), tmp_path) as agent:
            yield rack, agent, gpus, gpus[0].power_limit_mw


def _cool(rack, gpus) -> None:
    """The GPUs as cool as they get once a thermal fault has cleared, set in the simulator's model at once: what
    these tests prove starts after the cooling, so they do not wait out the model's physics (up to a minute)."""
    with rack.sim.model.lock:
        for g in gpus:
            g.temp_c = g.slowdown_c - 30.0
    wait_for(lambda: all(not g.hw_thermal_slowdown and g.temp_c < g.slowdown_c - 10 for g in gpus), 20,
             what="GPUs cool")


def test_a_thermal_cap_is_undone_when_the_condition_cleared_while_the_agent_was_stopped(tmp_path):
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        cfg = _config(rack, tmp_path, gpu_thermal={"fire_seconds": 0, "clear_seconds": 2})
        gpu = rack.sim.model.nodes["node01"].gpus[0]
        default = gpu.power_limit_mw
        with running_agent(cfg, tmp_path) as agent:
            rack.inject("thermal", node="node01", gpu=0, celsius=40)
            wait_for(lambda: gpu.power_limit_mw == int(default * 0.75), 30, what="GPU 0 capped to 75 %")
            wait_for(lambda: [i for i in _incidents(agent)["open"] if i["state"] == "mitigated"], 10,
                     what="thermal incident mitigated")
        rack.clear()  # the fault ends while no agent runs
        _cool(rack, [gpu])
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: gpu.power_limit_mw == default, 30, what="cap undone after the restart")
            # the thermal incident's own: under the suite's load a leak poll can time out at the start and open
            # leak_source_down (critical, as it should), which is not what this test is about
            wait_for(lambda: not [i for i in _incidents(agent)["open"] if i["detector"] == "gpu_thermal"], 10,
                     what="the thermal incident resolved")
            assert _journal(agent, kind="result", action="gpu_power_cap", result="undone")


def test_a_leak_that_dries_during_a_reload_resolves_and_its_caps_are_undone(tmp_path):
    # The clear hold outlasts the reload, so the old engine cannot be the one that clears it (checked below).
    with _rack_agent(tmp_path, leak={"fire_seconds": 0, "clear_seconds": 8}) as (rack, agent, gpus, default):
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        rack.inject("leak", zone="zone-a")
        wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 20, what="zone GPUs capped")
        inc = wait_for(lambda: [i for i in _incidents(agent)["open"] if i["detector"] == "leak"], 10)[0]
        rack.clear()
        agent.signal(signal.SIGHUP)  # the zone dries while the agent rebuilds its engine
        resolved = wait_for(lambda: [e["seq"] for e in _journal(agent, kind="incident", incident_id=inc["id"])
                                     if e["result"] == "resolved"], 40, what="leak incident resolved after the reload")
        starts = [e["seq"] for e in _journal(agent, kind="engine", result="started")]
        assert len(starts) == 2 and resolved[0] > starts[1]  # cleared by the engine the reload built
        assert not [i for i in _incidents(agent)["open"] if i["id"] == inc["id"]]
        # Undo runs in reverse step order: the resume waits for a person (resume_after_leak), then the caps.
        pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "drain"],
                           20, what="resume pending approval")
        assert all(g.power_limit_mw == g.min_limit_mw for g in gpus)
        assert agent.request("POST", f"/api/v1/incidents/{pending[0]['id']}/approve", token=TOKEN)[0] == 200
        wait_for(lambda: all(g.power_limit_mw == default for g in gpus), 30, what="caps undone")


def test_a_person_resolves_or_rejects_an_incident_through_the_cli(tmp_path):
    with _rack_agent(tmp_path, gpu_thermal={"fire_seconds": 0, "clear_seconds": 300}) as (rack, agent, gpus, default):
        rack.inject("thermal", node="node01", gpu=0, celsius=40)
        rack.inject("thermal", node="node01", gpu=1, celsius=40)
        wait_for(lambda: all(g.power_limit_mw == int(default * 0.75) for g in gpus), 30, what="both capped")
        def thermal() -> list[dict]:  # the two GPUs' incidents (a loaded machine may open others, e.g. a source)
            return [i for i in _incidents(agent)["open"] if i["detector"] == "gpu_thermal"]
        wait_for(lambda: len([i for i in thermal() if i["state"] == "mitigated"]) == 2, 30)
        a, b = sorted(thermal(), key=lambda i: i["targets"]["gpu"])
        out = _cli(tmp_path, "incidents", "resolve", a["id"])
        assert out.returncode == 0 and out.stdout.split()[-2:] == ["by", "admin"], out
        wait_for(lambda: gpus[0].power_limit_mw == default, 20, what="GPU 0's cap undone by resolve")
        out = _cli(tmp_path, "incidents", "reject", b["id"])
        assert out.returncode == 0 and "rejected" in out.stdout, out
        wait_for(lambda: not thermal(), 30, what="both closed")
        assert gpus[1].power_limit_mw == int(default * 0.75)  # rejected: left as it is, for the person
        assert _journal(agent, kind="result", action="gpu_power_cap", result="released")
        closed = [e for e in _journal(agent, kind="incident", result="resolved")
                  if e["detail"].get("detector") == "gpu_thermal"]
        assert {e["detail"]["detail"]["closed_by"] for e in closed} == {"admin"}
        assert _cli(tmp_path, "incidents", "resolve", a["id"]).returncode == 1  # already closed
        # restarted once the GPUs are cool: neither incident comes back, the released cap is not undone
        agent.stop()
        rack.clear()
        _cool(rack, gpus)
        agent.start()
        wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
        assert not thermal()  # (a leak source that missed its first polls on a loaded host is another incident)
        assert gpus[1].power_limit_mw == int(default * 0.75)


# -- 4: no resume on a timer after a GPU fault; a health check or a person ---------------------------


def test_a_node_drained_for_a_gpu_fault_is_not_resumed_on_a_timer_while_its_health_check_fails(clean_cluster, tmp_path):
    """The resume policy of a GPU-fault drain (gpu-lost's): a fault that clears is no proof the GPU is fixed. (A
    reset-class XID's incident clears only on a proven reset: tests/test_gpu_faults.py; its resume goes through the
    same check.)"""
    cluster = clean_cluster
    diag = tmp_path / "gpu-diag"  # stands in for `dcgmi diag -r 1`: fails until a person has reset the GPU
    diag.write_text(f"#!/bin/sh\n[ -e '{tmp_path / 'reset-done'}' ] && exit 0\n"
                    "echo \"diag: GPU 0 fails memory test, reset required ($1)\" >&2\nexit 1\n")
    diag.chmod(0o755)
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        cfg = _config(rack, tmp_path, cluster.conf, gpu_lost={"fire_seconds": 0, "clear_seconds": 3})
        cfg["remediation"]["exec_allow"] = {"gpu-diag": {"path": str(diag)}}
        cfg["remediation"]["resume_health_check"] = "gpu-diag"
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("gpu-lost", node="node01", gpu=0)
            drained = wait_for(lambda: _journal(agent, kind="result", action="drain", result="done"), 30,
                               what="drained")
            rack.clear()
            # The GPU answers again and its incident resolves, but the health check fails: a person decides.
            check = wait_for(lambda: _journal(agent, kind="health_check"), 30, what="resume health check")
            assert check[0]["result"] == "failed" and "reset required (node01)" in check[0]["detail"]["why"], check
            pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "drain"],
                               10, what="resume waits for approval")
            assert pending[0]["approval"] == "resume_after_check" and pending[0]["phase"] == "undo"
            # the GPU's incident is closed (a leak source that missed polls on a loaded host may open another)
            assert drained[0]["incident_id"] not in {i["id"] for i in _incidents(agent)["open"]}
            assert node_states(cluster)["node01"] in ("drained", "draining")
            assert agent.request("POST", f"/api/v1/incidents/{pending[0]['id']}/approve", token=TOKEN)[0] == 200
            wait_for(lambda: node_states(cluster).get("node01") == "idle", 30, what="resumed after approval")
            assert _journal(agent, kind="approval", result="approved")[0]["detail"]["approved_by"] == "admin"


def test_a_node_drained_for_a_gpu_fault_resumes_by_itself_when_the_nvml_check_passes(clean_cluster, tmp_path):
    cluster = clean_cluster
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        cfg = _config(rack, tmp_path, cluster.conf, gpu_lost={"fire_seconds": 0, "clear_seconds": 3})
        with running_agent(cfg, tmp_path) as agent:
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("gpu-lost", node="node01", gpu=0)
            wait_for(lambda: _journal(agent, kind="result", action="drain", result="done"), 30, what="drained")
            rack.clear()
            wait_for(lambda: node_states(cluster).get("node01") == "idle", 30, what="resumed after the check passed")
            check = _journal(agent, kind="health_check")
            assert [c["result"] for c in check] == ["passed"] and check[0]["detail"]["check"] == "nvml"


# -- maintenance -------------------------------------------------------------------------------------


def _maintenance_metric(agent, node: str) -> float | None:
    m = re.search(rf'^supernode_remediation_maintenance{{node="{node}"}} (\S+)$', agent.metrics(), re.M)
    return float(m.group(1)) if m else None


def test_maintenance_stops_the_agent_acting_on_the_node_and_survives_a_restart(clean_cluster, tmp_path):
    cluster = clean_cluster
    with sim_rack(tmp_path, nodes=2, gpus=2) as rack:
        with running_agent(_config(rack, tmp_path, cluster.conf), tmp_path) as agent:
            assert _maintenance_metric(agent, "node01") == 0
            out = _cli(tmp_path, "maintenance", "on", "--node", "node01", "--until", "2h")
            assert out.returncode == 0 and "node01" in out.stdout, out
            agent.stop()
            agent.start()  # an upgrade in the middle of the work: maintenance holds
            assert _maintenance_metric(agent, "node01") == 1 and _maintenance_metric(agent, "node02") == 0
            assert _incidents(agent)["maintenance"]["node01"]["by"] == "admin"
            wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="agent ready")
            rack.inject("xid", node="node01", gpu=0, code=48)  # reset class: its drain is what maintenance blocks
            rows = wait_for(lambda: _journal(agent, kind="blocked", action="drain"), 30, what="drain blocked")
            assert rows[0]["detail"]["guardrail"] == "maintenance" and "by admin" in rows[0]["detail"]["why"]
            assert node_states(cluster)["node01"] == "idle"
            assert re.search(r'event="drain blocked".*guardrail=maintenance', agent.log())
            out = _cli(tmp_path, "maintenance", "off", "--node", "node01")
            assert out.returncode == 0 and "no node in maintenance" in out.stdout, out
            assert _maintenance_metric(agent, "node01") == 0
            assert _cli(tmp_path, "maintenance", "on", "--node", "node09").returncode == 1  # not in this rack


# -- 8: decisions are logged, one structured line each; format and level from the config ----------------


def test_webhook_rejections_are_logged_as_json_lines_when_the_config_says_json(tmp_path):
    from tests.agentproc import base_config

    cfg = base_config(tmp_path, token=TOKEN, logging={"format": "json", "level": "info"})
    cfg["secrets"]["webhook_token"] = {"file": str(tmp_path / "admin.token")}
    with running_agent(cfg, tmp_path) as agent:
        assert agent.request("POST", "/api/v1/alerts", body={"version": "4"}, token="wrong")[0] == 401
        assert agent.request("POST", "/api/v1/alerts", raw=b"{not json", token=TOKEN)[0] in (400, 422)

        def rejections() -> list[dict]:
            return [r for r in map(json.loads, agent.log().splitlines()) if r.get("decision") == "webhook"]
        rows = wait_for(lambda: len(rejections()) == 2 and rejections(), 10, what="two rejection lines")
        assert [(r["status"], r["level"]) for r in rows][0] == (401, "warning")
        assert rows[0]["peer"] == "127.0.0.1" and rows[1]["why"]
        assert any(r.get("event") == "engine started" for r in map(json.loads, agent.log().splitlines()))


# -- small pieces, without a daemon ------------------------------------------------------------------


def test_maintenance_ends_by_itself_at_its_until_time_and_says_so_in_the_journal(tmp_path):
    from agent.remediation.journal import Journal
    from agent.remediation.maintenance import Maintenance

    now = [1000.0]
    m = Maintenance(Journal(tmp_path / "j.db"), clock=lambda: now[0])
    m.set("node01", True, "alice", until=1060.0)
    assert m.active("node01") and not m.active("node02")
    with pytest.raises(ValueError, match="until"):
        m.set("node02", True, "bob", until=999.0)
    now[0] = 1060.0
    assert not m.active("node01")
    rows = [(e.result, e.detail.get("by")) for e in m.journal.entries() if e.kind == "maintenance"]
    assert rows == [("on", "alice"), ("off", "expiry")]
    again = Maintenance(m.journal, clock=lambda: now[0])
    assert again.restore() == 0


def test_a_resume_health_check_that_names_no_known_check_is_refused_naming_the_field(tmp_path):
    from pydantic import ValidationError

    from agent.remediation.settings import RemediationSettings

    with pytest.raises(ValidationError, match="resume_health_check: 'dcgm' is neither nvml, none nor a program"):
        RemediationSettings.model_validate({"resume_health_check": "dcgm"})
    ok = RemediationSettings.model_validate({"resume_health_check": "diag", "exec_allow": {"diag": {"path": "/bin/true"}}})
    assert ok.resume_health_check == "diag"


def test_until_accepts_a_duration_or_an_iso_time():
    from agent.remediation.cli import parse_until

    assert parse_until("90m", now=1000.0) == 1000.0 + 5400
    import datetime

    utc_14h = datetime.datetime(2026, 12, 1, 14, 0, tzinfo=datetime.timezone.utc).timestamp()
    assert parse_until("2026-12-01T14:00:00+00:00") == utc_14h
    assert parse_until("2026-12-01T16:00:00+02:00") == utc_14h
    assert parse_until(None) is None
    with pytest.raises(SystemExit, match="--until 'soon'"):
        parse_until("soon")
