"""The fault drill end to end: the real daemon, the simulated rack (real Modbus CDU), a real single-host Slurm and
the reference job (examples/drill_job.py); `supernode-agent drill` run as an operator runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from sim.demo import agent_config
from sim.demo_drill import write_drill_kit
from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import REPO, free_port, require_binary, wait_for
from tests.slurm import batch_job, node_states, running_cluster

TOKEN = "token-for-drills"
DRAINED = ("drained", "draining", "drain")


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"], "sbatch", "squeue", "scancel", "scontrol")


@dataclass
class Rig:
    """The module's one simulated rack and one agent (node01's), shared by its tests: each test reads only the
    journal rows written after it began (`since`)."""

    rack: Any
    cluster: Any
    agent: Any
    cfg: dict
    zone: str  # node01's leak zone


@pytest.fixture(scope="module")
def rig(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drill-rig")
    with sim_rack(tmp) as rack:
        cfg = agent_for(rack, cluster, "node01", tmp)
        with running_agent(cfg, tmp) as agent:
            wait_for(lambda: "supernode_leak_detected{" in agent.metrics(), 60, what="the leak sensors polled")
            yield Rig(rack, cluster, agent, cfg, zone_of(cfg, "node01"))


def job_node(cluster, job: str) -> str:
    def running() -> str | None:
        q = subprocess.run(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%N"], env=cluster.env,
                           capture_output=True, text=True, timeout=20)
        return q.stdout.strip() or None
    return wait_for(running, 60, what=f"job {job} running")


def reference_job(script, comment: str = "drill-safe", node: str | None = None):
    """The reference job (the demo kit's script), submitted as the README says: requeueable, drill-safe, any node
    unless `node`."""
    return lambda cluster: batch_job(cluster, script, node=node, args=(f"--comment={comment}", "--requeue",
                                                                        "--open-mode=append"))


def agent_for(rack, cluster, node: str, tmp_path) -> dict:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, node, free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
    cfg["remediation"]["slurm"]["checkpoint_signal"] = "USR1"
    # each test's drill drains node01 again seconds after the last one's undo: the cooldown is not under test here
    cfg["remediation"]["guardrails"]["cooldown_seconds"] = 0
    # a leak's incident clears 2 s after its zone reads dry (shipped: 10 s), so each undo starts that much sooner
    cfg["remediation"]["detectors"] = {"leak": {"fire_seconds": 0.0, "clear_seconds": 2.0}}
    # The shipped leak poll timeout (0.4 s) is for a leak controller on its own network; here the Modbus servers
    # share the test process with everything else on a loaded 2-core host, and every poll past the timeout makes
    # the zone's detectors unreadable, which restarts the leak's dry hold (no undo before every detector read dry
    # for it without a gap): the drill's undo then waits on the host's load, not on the agent.
    cfg["sources"]["leak"]["timeout"] = 2.0
    # Likewise the NVML twin answers from the test process: its GPUs read "hung" when a loaded host delays an
    # answer past the shipped 0.5 s per GPU (gpu_lost drains node01 once one stays hung past its 10 s hold).
    cfg["sources"]["nvml"].update(interval=2.0, timeout=4.0, gpu_timeout=3.0)
    return cfg


def zone_of(cfg: dict, node: str) -> str:
    return next(z["name"] for z in cfg["inventory"]["leak_zones"] if z["nodes"] == [node])


TARGETS = {"detected": 30, "decided": 30, "drained": 60, "signal_delivered": 60, "job_requeued": 120,
           "job_resumed": 240, "undo_done": 240}


def write_plan(tmp_path, zone: str, node: str, **extra) -> str:
    plan = {"name": "leak-drill", "scenario": {"kind": "leak", "zone": zone}, "nodes": [node], "targets": TARGETS,
            **extra}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return str(path)


def cli(agent, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(agent.config_path), "drill", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def journal(agent, after: int = 0) -> list[dict]:
    """The journal's rows written after row `after` (a test's `since`), oldest first."""
    status, body = agent.get("/api/v1/journal?limit=5000", token=TOKEN)
    assert status == 200, body
    return [r for r in json.loads(body)["entries"] if r["seq"] > after]


def since(agent) -> int:
    """The journal's last row now: what a test reads after."""
    return max((r["seq"] for r in journal(agent)), default=0)


def status_view(agent, token: str | None = None) -> dict:
    status, body = agent.get("/api/v1/status", token=token)
    assert status == 200, body
    return json.loads(body)


def events(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_plan_whose_zone_drains_a_node_outside_it_is_refused_naming_the_field(rig, tmp_path):
    after = since(rig.agent)
    res = cli(rig.agent, write_plan(tmp_path, zone_of(rig.cfg, "node02"), "node01"))
    assert res.returncode == 1 and "nodes: a leak in zone" in res.stderr and "node02 not in" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscenario: {kind: leak}\nnodes: [node01]\nreal: [valve]\n")
    res = cli(rig.agent, str(bad))
    assert res.returncode == 2 and "scenario.leak.zone: Field required" in res.stderr
    assert "real.0: Input should be" in res.stderr
    assert not [r for r in journal(rig.agent, after) if r["kind"] == "drill" or "node=node01" in (r["target"] or "")]


def test_a_drill_naming_a_node_with_a_foreign_job_is_refused(rig, tmp_path):
    submit = reference_job(write_drill_kit(tmp_path)[1], comment="training-run", node="node01")
    after = since(rig.agent)
    with submit(rig.cluster) as job:
        job_node(rig.cluster, job)
        res = cli(rig.agent, write_plan(tmp_path, rig.zone, "node01"))
        assert res.returncode == 1, res
        assert f"job {job} on node01 is not marked drill-safe" in res.stderr
        assert node_states(rig.cluster)["node01"] not in DRAINED
        # nothing started (the rig's agent may journal other incidents meanwhile: its sources on a loaded host)
        assert not [r for r in journal(rig.agent, after) if r["kind"] == "drill" or "node=node01" in (r["target"] or "")]


@contextmanager
def placed_on_node01(cluster):
    """The reference job may run anywhere (its requeue must find node02), but the rig's agent is node01's: node02
    is held out of scheduling (drained by the test, with its reason) only until the job runs on node01."""
    cluster.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=test: the drill job starts on node01")
    try:
        yield
    finally:
        res = cluster.scontrol("update", "NodeName=node02", "State=RESUME")
        assert res.returncode == 0, res.stderr


@pytest.mark.timeout(600)  # a requeue and a restart on a loaded 2-core machine
def test_a_leak_drill_checkpoints_requeues_and_resumes_the_job_on_the_other_node(rig, tmp_path):
    agent, cluster = rig.agent, rig.cluster
    # The demo's drill kit: examples/drill-leak.yaml (zone-a, node01: the rig's) with its job log here, and the
    # reference job's script; only the targets are the test's (a loaded host), and the abort sooner.
    plan_path, script = write_drill_kit(tmp_path)
    kit = yaml.safe_load(plan_path.read_text())
    assert kit["scenario"] == {"kind": "leak", "zone": rig.zone} and kit["nodes"] == ["node01"], kit
    log = tmp_path / "drill" / "events.jsonl"
    assert kit["job"] == {"log": str(log)}
    submit = reference_job(script)
    with ExitStack() as held:
        with placed_on_node01(cluster):
            job = held.enter_context(submit(cluster))
            assert job_node(cluster, job) == "node01"
        wait_for(lambda: node_states(cluster)["node02"] == "idle", 30, what="node02 back in service")
        wait_for(lambda: any(e["event"] == "start" for e in events(log)), 60, what="the job's first start")
        after = since(agent)
        assert status_view(agent)["drill"] is None or not status_view(agent)["drill"]["active"]
        plan = tmp_path / "plan.yaml"
        plan.write_text(yaml.safe_dump({**kit, "abort": {"after_seconds": 300}, "targets": TARGETS}))
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(agent.config_path), "drill",
                                 str(plan), "--format", "json", "--wait", "600"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)
        valves, others, drill_series, banners = [], [], [], []
        deadline = time.monotonic() + 700
        while proc.poll() is None and time.monotonic() < deadline:
            valves.append(dict(rig.rack.sim.model.coolant.valve_open))  # sampled all along the drill
            others.append(node_states(cluster).get("node02"))
            text = agent.metrics()
            drill_series += [line for line in text.splitlines() if not line.startswith("#")
                             and ('drill="true"' in line or line.startswith("supernode_drill_active{"))]
            banners.append(status_view(agent)["drill"])  # what a page without the token shows
            time.sleep(0.2)  # a sampling period, not a synchronisation: the loop ends on the CLI's exit
        out, err = proc.communicate(timeout=30)
        data = json.loads(out)
        rep = data["report"]
        assert proc.returncode == 0 and data["state"] == "passed", ([(s["stage"], s["seconds"], s["why"])
                                                                     for s in rep["stages"]], err)
        assert [(s["stage"], s["result"]) for s in rep["stages"]] == [
            (s, "PASS") for s in ("detected", "decided", "drained", "signal_delivered", "job_requeued",
                                  "job_resumed", "undo_done")], rep["stages"]
        rows = journal(agent, after)
    # the job's own word: checkpointed on node01, started again on node02 from that checkpoint
    ev = [e for e in events(log) if e["job"] == job]
    cps = [e for e in ev if e["event"] == "checkpoint"]
    assert cps and cps[0]["node"] == "node01"
    resumed = [e for e in ev if e["event"] == "start" and e["from_checkpoint"]]
    assert resumed and resumed[0]["node"] == "node02" and resumed[0]["step"] == cps[0]["step"]
    # nothing outside the plan's node was touched: Slurm never drained node02, no row acted on it
    assert others and not any(s in DRAINED for s in others), others
    acted = [r for r in rows if r["kind"] in ("intent", "result") and r["target"]]
    assert acted and all("node=node02" not in r["target"] for r in acted), acted
    # the valve stayed dry-run: journaled as what it would have done, never moved in the simulator
    valve_rows = [(r["kind"], r["result"]) for r in rows if r["action"] == "cdu_write"]
    assert valve_rows == [("approval", "pending"), ("approval", "approved"), ("result", "dry_run")], valve_rows
    assert [d["action"] for d in rep["dry_run"]] == ["cdu_write"]
    assert valves and all(all(v.values()) for v in valves)
    # marked drill everywhere: the incident, its rows, the metric label
    inc = [r for r in rows if r["kind"] == "incident" and r["detail"]["detector"] == "leak"]
    assert inc and all(r["detail"]["detail"].get("drill") for r in inc)
    assert all(r["detail"]["detail"]["sensors"] == [] and r["detail"]["detail"]["drill_sensors"] == ["drill"]
               for r in inc)  # the synthetic sensor apart from the zone's real ones
    assert any(line.startswith("supernode_leak_detected{") for line in drill_series)
    assert 'supernode_drill_active{drill="%s",scenario="leak"} 1.0' % kit["name"] in drill_series
    assert node_states(cluster)["node01"] not in DRAINED  # the undo resumed it
    # the status page: a banner on every page while it ran (no token needed), the report with the token after
    running = [b for b in banners if b and b["active"]]
    assert running and all(b["name"] == kit["name"] and b["scenario"] == f"leak in zone {rig.zone}"
                           and b["nodes"] == ["node01"] and "report" not in b for b in running)
    assert not status_view(agent)["drill"]["active"]
    page = status_view(agent, TOKEN)["drill"]
    assert page["state"] == "passed" and page["report"]["stages"] == rep["stages"]
    assert "report" not in status_view(agent)["drill"]
    assert_no_shipped_alert_fires(drill_series, tmp_path)


def assert_no_shipped_alert_fires(lines: list[str], tmp_path) -> None:
    """promtool over the shipped rules, fed the drill's series exactly as the agent served them (with the
    target's labels Prometheus adds): no alert of the rules fires on them."""
    promtool = require_binary("promtool")
    series = {}
    for line in lines:
        m = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        assert m, line
        series[f'{m.group(1)}{{{m.group(2)},rack="r01",job="supernode-agent",instance="a:9877"}}'] = m.group(3)
    assert series, "no drill series to check"
    rules = [REPO / "alerts" / "recording.rules.yml", REPO / "alerts" / "supernode.rules.yml"]
    names = sorted({r["alert"] for f in rules for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
                    if "alert" in r})
    test = {"rule_files": [str(f) for f in rules], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": k, "values": f"{float(v):g}x30"} for k, v in series.items()],
        "alert_rule_test": [{"alertname": n, "eval_time": t, "exp_alerts": []} for n in names
                            for t in ("1m", "30m")]}]}
    path = tmp_path / "drill_promtool.yml"
    path.write_text(yaml.safe_dump(test))
    res = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def held_drill(rig: Rig, tmp_path) -> int:
    """A leak drill on node01 held for an hour, started through the API once node01 is drained; the journal's
    last row before it (the test's `since`)."""
    after = since(rig.agent)
    plan = yaml.safe_load(open(write_plan(tmp_path, rig.zone, "node01", hold_seconds=3600)))
    status, body = rig.agent.request("POST", "/api/v1/drill", {"plan": plan}, token=TOKEN)
    assert status == 200, body
    wait_for(lambda: node_states(rig.cluster)["node01"] in DRAINED, 60, what="the drill drained node01")
    return after


@pytest.mark.timeout(300)
def test_an_aborted_drill_undoes_what_it_did(rig, tmp_path):
    agent, cluster = rig.agent, rig.cluster
    after = held_drill(rig, tmp_path)
    res = cli(agent, "--abort")
    assert res.returncode == 0, res

    def ended() -> dict | None:
        view = json.loads(agent.get("/api/v1/drill", token=TOKEN)[1])
        return view if view["state"] == "aborted" else None
    view = wait_for(ended, 120, what="the drill aborted")
    assert node_states(cluster)["node01"] not in DRAINED
    stages = {s["stage"]: s["result"] for s in view["report"]["stages"]}
    assert stages["drained"] == "PASS" and stages["undo_done"] == "PASS"
    rows = journal(agent, after)
    assert [r["result"] for r in rows if r["kind"] == "drill"] == ["injected", "aborted"]
    assert [r["result"] for r in rows if r["action"] == "drain" and r["kind"] == "result"] == ["done", "undone"]
    incidents = json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])
    assert not [i for i in incidents["open"] if i["detector"] == "leak"]


@pytest.mark.timeout(300)
def test_an_agent_restarted_mid_drill_keeps_the_incident_a_drill_and_abort_undoes_it(rig, tmp_path):
    """Last of the module: it restarts the rig's agent (the same state dir, so the journal restores the incident)."""
    agent, cluster = rig.agent, rig.cluster
    after = held_drill(rig, tmp_path)
    iid = next(i["id"] for i in json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])["open"]
               if i["detector"] == "leak" and i["detail"].get("drill"))
    agent.stop()
    agent.start()

    def cleared() -> list[dict]:
        found = json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])
        return [i for i in found["recent"] if i["id"] == iid and i["detail"].get("drill")]
    # Its synthetic reading went with the old process: the zone reads dry and the restored incident clears, still
    # the drill's, its undo waiting for a person as after any leak (a leak's resume is never automatic)
    wait_for(cleared, 60, what="the drill's incident restored, still marked drill, and cleared")
    assert node_states(cluster)["node01"] in DRAINED
    res = cli(agent, "--abort")
    assert res.returncode == 0 and f"undo approved for {iid}" in res.stdout, res

    def undone() -> list[dict]:  # the journal's word (its row comes once Slurm read the resume back), then Slurm's
        rows = journal(agent, after)
        drains = [r["result"] for r in rows if r["action"] == "drain" and r["kind"] == "result"]
        return rows if drains and drains[-1] == "undone" else []
    rows = wait_for(undone, 120, what="the undo resumed node01")
    assert node_states(cluster)["node01"] not in DRAINED
    assert [r["result"] for r in rows if r["kind"] == "drill"][-1] == "aborted"
    assert not [r for r in rows if r["action"] == "cdu_write" and r["result"] == "done"]
    assert all(rig.rack.sim.model.coolant.valve_open.values())
