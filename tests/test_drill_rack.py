"""A zone drill on a rack whose zone spans two nodes, each with its own agent (issue 36): the real daemons in
static coordination, the simulated rack (zone-a: node01 and node02, zone-b: node03), a real single-host Slurm of
the three nodes and the reference job (examples/drill_job.py).

The drill is started on node01's agent; node02's agent takes part through the rack (node01's signed
announcement on its drill feed) and drains its own node; node03's agent hears the announcement and leaves it
(its node is not in the plan). node03's agent follows a stand-in for node02's feed (`FakeFeed`): what an attacker
at a peer's address serves it (garbage, forged and replayed announcements) is refused and counted, and never
drains anything."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from agent.drill.plan import parse_plan
from agent.drill.records import announcement, node_doc
from sim.demo_drill import write_drill_kit
from sim.harness import sim_rack
from tests.agentproc import AgentProcess
from tests.coordination_rack import SHARED
from tests.helpers import REPO, free_port, wait_for
from tests.slurm import node_states, running_cluster
from tests.test_drill import DRAINED, TARGETS, TOKEN, agent_for, events, job_node, journal, reference_job, since

NODES = ["node01", "node02", "node03"]
ZONES = {"zone-a": ["node01", "node02"], "zone-b": ["node03"]}


class FakeFeed(BaseHTTPRequestHandler):
    """What answers node03's agent at node02's address: the drill feed's lines the test sets (`serve`), each
    connection held open until the next `serve` closes it (node03's agent then reconnects and reads the new
    ones); every other path 404."""

    lines: list[bytes] = []
    generation = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/api/v1/coordination/drill":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        mine = type(self).generation
        for line in list(type(self).lines):
            self.wfile.write(line + b"\n")
        self.wfile.flush()
        while type(self).generation == mine:  # held open, as a live peer's feed is
            time.sleep(0.1)

    def log_message(self, *args: Any) -> None:
        pass

    @classmethod
    def serve(cls, lines: list[bytes]) -> None:
        cls.lines = lines
        cls.generation += 1


@dataclass
class Rig:
    sim: Any
    cluster: Any
    agents: dict[str, AgentProcess]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drill-rack")
    fake = ThreadingHTTPServer(("127.0.0.1", free_port()), FakeFeed)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    cluster_gen = running_cluster(NODES, "sbatch", "squeue", "scancel", "scontrol")
    cluster = next(cluster_gen)
    agents: dict[str, AgentProcess] = {}
    try:
        with sim_rack(tmp, nodes=3, gpus=2, leak_zones=ZONES) as sim:
            cfgs = {}
            for node in NODES:
                work = tmp / node
                work.mkdir()
                cfg = agent_for(sim, cluster, node, work)
                cfg["sources"]["links"] = {"enabled": False}
                cfg["sources"]["dom"] = {"enabled": False}
                cfgs[node] = (cfg, work)
            urls = {n: f"http://127.0.0.1:{c['listen']['port']}" for n, (c, _) in cfgs.items()}
            for node, (cfg, work) in cfgs.items():
                cfg["inventory"]["agent_urls"] = {**urls, **({"node02": f"http://127.0.0.1:{fake.server_port}"}
                                                             if node == "node03" else {})}
                # node01 polls the shared devices; the others read its polls (the leak's dry hold among them)
                cfg["coordination"] = {"backend": "static", "pollers": {d: ["node01"] for d in SHARED}}
                agents[node] = AgentProcess(cfg, work).start()
            wait_for(lambda: all("supernode_leak_detected{" in a.metrics() for a in agents.values()), 60,
                     what="every agent reads the leak sensors")
            try:
                yield Rig(sim, cluster, agents)
            finally:
                for a in agents.values():  # before the simulated rack: a stopping agent waits on no device
                    a.stop()
    finally:
        for a in agents.values():
            a.stop()
        fake.shutdown()
        try:
            next(cluster_gen)
        except StopIteration:
            pass


def plan_of(tmp_path, **extra) -> dict:
    return {"name": "zone-a-drill", "scenario": {"kind": "leak", "zone": "zone-a"}, "nodes": ["node01", "node02"],
            "targets": TARGETS, "abort": {"after_seconds": 300}, **extra}


@contextmanager
def placed_on_node02(cluster):
    """The reference job may run anywhere (its requeue must find node03, the only node the drill leaves in
    service), but it starts on node02, the node its own agent drains: node01 and node03 are held out of
    scheduling until it runs there."""
    for n in ("node01", "node03"):
        cluster.scontrol("update", f"NodeName={n}", "State=DRAIN", "Reason=test: the drill job starts on node02")
    try:
        yield
    finally:
        for n in ("node01", "node03"):
            res = cluster.scontrol("update", f"NodeName={n}", "State=RESUME")
            assert res.returncode == 0, res.stderr


def rows_of(agent, after: int, kind: str | None = None) -> list[dict]:
    return [r for r in journal(agent, after) if kind is None or r["kind"] == kind]


def drill_rows(agent, after: int) -> list[dict]:
    """What an agent journaled of a drill or a leak since row `after`: its drill rows, any leak incident, any drain
    (the rig's agents may journal other incidents meanwhile: their sources on a loaded host)."""
    return [r for r in journal(agent, after) if r["kind"] == "drill" or r["action"] == "drain"
            or (r["kind"] == "incident" and r["detail"]["detector"] in ("leak", "leak_tray"))]


@pytest.mark.timeout(600)  # a requeue and a restart on a loaded 2-core machine
def test_a_zone_drill_drains_both_nodes_by_their_own_agents_and_the_job_resumes_on_the_third(rig, tmp_path):
    a1, a2, a3 = (rig.agents[n] for n in NODES)
    cluster = rig.cluster
    _, script = write_drill_kit(tmp_path)
    log = tmp_path / "drill" / "events.jsonl"
    with ExitStack() as held:
        with placed_on_node02(cluster):
            job = held.enter_context(reference_job(script)(cluster))
            assert job_node(cluster, job) == "node02"
        wait_for(lambda: all(node_states(cluster)[n] == "idle" for n in ("node01", "node03")), 30,
                 what="node01 and node03 back in service")
        wait_for(lambda: any(e["event"] == "start" for e in events(log)), 60, what="the job's first start")
        after = {n: since(a) for n, a in rig.agents.items()}
        plan = tmp_path / "plan.yaml"
        plan.write_text(yaml.safe_dump(plan_of(tmp_path, job={"log": str(log)})))
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(a1.config_path), "drill",
                                 str(plan), "--format", "json", "--wait", "600"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)
        states, valves, banners = [], [], []
        deadline = time.monotonic() + 700
        while proc.poll() is None and time.monotonic() < deadline:
            states.append(node_states(cluster))  # sampled all along the drill
            valves.append(dict(rig.sim.sim.model.coolant.valve_open))
            banners.append(json.loads(a2.get("/api/v1/status")[1])["drill"])  # node02's page, no token
            time.sleep(0.2)  # a sampling period, not a synchronisation: the loop ends on the CLI's exit
        out, err = proc.communicate(timeout=30)
        data = json.loads(out)
        rep = data["report"]
        assert proc.returncode == 0 and data["state"] == "passed", (
            [(s["stage"], s["seconds"], s["node"], s["why"]) for s in rep["stages"]], rep["per_node"], err)
    # each node of the zone drained and resumed by its own agent, both in the report
    assert set(rep["per_node"]) == {"node01", "node02"}
    for node, agent in (("node01", a1), ("node02", a2)):
        part = rep["per_node"][node]
        assert [part["stages"][s]["seconds"] is not None for s in ("detected", "drained", "undo_done")] == [True] * 3
        drains = [(r["result"], r["target"]) for r in rows_of(agent, after[node], "result") if r["action"] == "drain"]
        assert drains == [("done", f"node={node}"), ("undone", f"node={node}")], (node, drains)
        inc = [r for r in rows_of(agent, after[node], "incident") if r["detail"]["detector"] == "leak"]
        assert inc and all(r["detail"]["detail"].get("drill") for r in inc), node
        assert part["incident"] == inc[0]["incident_id"]
    drained = {s["stage"]: s for s in rep["stages"]}["drained"]
    assert drained["node"] in ("node01", "node02") and drained["seconds"] == max(
        rep["per_node"][n]["stages"]["drained"]["seconds"] for n in ("node01", "node02"))
    assert [r["result"] for r in rows_of(a2, after["node02"], "drill")] == ["joined", "ended"]
    assert any(b and b["active"] and b["conductor"] == "node01" for b in banners)  # node02's page says drill
    assert any(s["node01"] in DRAINED and s["node02"] in DRAINED for s in states)
    # nothing outside the plan: node03 never drained, its agent journaled nothing of the drill, and no row of the
    # report acted on it; the valve stayed dry-run (node01, the static leader, journaled it)
    assert states and not any(s["node03"] in DRAINED for s in states)
    assert not drill_rows(a3, after["node03"])
    assert rep["touched"] and all("node01" in t or "node02" in t for t in rep["touched"]), rep["touched"]
    assert {(d["action"], d["node"]) for d in rep["dry_run"]} == {("cdu_write", "node01")}
    assert valves and all(all(v.values()) for v in valves)
    # the job: signalled by node02's agent's drain, requeued by the drill, resumed on node03 from its checkpoint
    ev = [e for e in events(log) if e["job"] == job]
    cps = [e for e in ev if e["event"] == "checkpoint"]
    assert cps and cps[0]["node"] == "node02"
    resumed = [e for e in ev if e["event"] == "start" and e["from_checkpoint"]]
    assert resumed and resumed[0]["node"] == "node03" and resumed[0]["step"] == cps[0]["step"]
    stages = {s["stage"]: s for s in rep["stages"]}
    assert stages["signal_delivered"]["node"] == "node02" and stages["job_resumed"]["result"] == "PASS"
    assert all(node_states(cluster)[n] not in DRAINED for n in ("node01", "node02"))


@pytest.mark.timeout(300)
def test_an_aborted_zone_drill_undoes_on_both_nodes(rig, tmp_path):
    a1, a2 = rig.agents["node01"], rig.agents["node02"]
    after = {n: since(a) for n, a in rig.agents.items()}
    status, body = a1.request("POST", "/api/v1/drill", {"plan": plan_of(tmp_path, hold_seconds=3600)}, token=TOKEN)
    assert status == 200, body
    wait_for(lambda: all(node_states(rig.cluster)[n] in DRAINED for n in ("node01", "node02")), 60,
             what="both nodes of the zone drained")
    res = subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(a1.config_path), "drill", "--abort"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res

    def ended() -> dict | None:
        view = json.loads(a1.get("/api/v1/drill", token=TOKEN)[1])
        return view if view["state"] == "aborted" else None
    view = wait_for(ended, 120, what="the drill aborted")
    assert all(node_states(rig.cluster)[n] not in DRAINED for n in ("node01", "node02"))
    for node, agent in (("node01", a1), ("node02", a2)):
        drains = [r["result"] for r in rows_of(agent, after[node], "result") if r["action"] == "drain"]
        assert drains == ["done", "undone"], (node, drains)
        assert view["report"]["per_node"][node]["stages"]["undo_done"]["seconds"] is not None
    assert [r["result"] for r in rows_of(a2, after["node02"], "drill")] == ["joined", "aborted"]
    assert not drill_rows(rig.agents["node03"], after["node03"])


def rejected(agent, why: str) -> float:
    m = [line for line in agent.metrics().splitlines()
         if line.startswith("supernode_coordination_rejected_records_total{") and 'key_kind="drill"' in line
         and f'why="{why}"' in line]
    return float(m[0].rsplit(" ", 1)[1]) if m else 0.0


def test_forged_garbled_and_replayed_drill_records_from_a_peer_are_refused_and_drain_nothing(rig, tmp_path):
    """What answers node03's agent at node02's address serves drills of zone-b (node03's): every one is refused,
    counted by why, and node03 is never drained nor its incident opened."""
    a3 = rig.agents["node03"]
    after = since(a3)
    plan = parse_plan({"name": "forged", "scenario": {"kind": "leak", "zone": "zone-b"}, "nodes": ["node03"]})
    now = time.time()

    def doc(ann: dict, node: str = "node02") -> bytes:
        return node_doc(node, ann, None)
    genuine = announcement(plan, f"forged@node02:{int(now * 1000)}", "admin", "node02", now, False, TOKEN)
    wrong_key = announcement(plan, "x@node02:1", "admin", "node02", now, False, "not-the-admin-token")
    widened = {**genuine, "plan": {**genuine["plan"], "real": [*genuine["plan"]["real"], "cdu_write"]}}
    unknown = announcement(plan, "x@node02:2", "root", "node02", now, False, TOKEN)
    replayed = announcement(plan, "x@node02:3", "admin", "node02", now - 7200, False, TOKEN)
    unsigned = {k: v for k, v in genuine.items() if k != "proof"}
    before = {why: rejected(a3, why) for why in ("not_json", "mismatch", "bad_proof", "unknown_token", "expired",
                                                 "no_proof")}
    FakeFeed.serve([b"\xff\xfe{not json", doc(genuine, node="node01"), doc(wrong_key), doc(widened), doc(unknown),
                    doc(replayed), doc(unsigned)])
    wait_for(lambda: all(rejected(a3, why) > n for why, n in before.items()), 30,
             what="every forged drill record refused and counted")
    FakeFeed.serve([])
    assert node_states(rig.cluster)["node03"] not in DRAINED
    assert json.loads(a3.get("/api/v1/drill", token=TOKEN)[1])["state"] == "idle"
    assert 'supernode_drill_active{' not in a3.metrics()
    assert not drill_rows(a3, after)
