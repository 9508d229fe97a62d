"""End to end with real peers: simulator -> agents -> Prometheus -> Alertmanager -> webhook -> Slurm.

One stack for the module: the simulated rack (2 nodes x 4 GPUs), a private
single-host Slurm with slurmds named like the simulator's nodes, one real
agent process per node (enforce mode, draining through that Slurm), the
Debian Prometheus scraping both agents every second (target labels rack and
node) with the shipped rules on a test time scale, and the Debian
Alertmanager routing remediation="agent" alerts to node01's webhook.

node02's local nvlink_errors detector is off, so a drain of node02 after an
NVLink storm on node02 can only come from the webhook path (node01's agent
acts on the node the alert names). The dashboard test then runs every panel
query of every shipped dashboard against the same Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any, Iterator

import pytest

from sim.demo import agent_config
from sim.server import Simulator
from dashboards import build
from tests.agentproc import AgentProcess
from tests.helpers import REPO, free_port, require_binary, wait_for
from tests.peers import Peer, accelerated_rules, agent_webhook_config, alertmanager_server, prometheus_server
from tests.sim_thread import SimThread
from tests.slurm import SlurmCluster

NODES = ("node01", "node02")
ALERT = "SupernodeNvlinkErrors"
MARKER = "supernode-agent:"
PEER_BINARIES = ("prometheus", "prometheus-alertmanager", "munged", "slurmctld", "slurmd", "scontrol", "sinfo")


class Stack:
    def __init__(self, sim: SimThread, slurm: SlurmCluster, agents: dict[str, AgentProcess], prom: Peer,
                 am: Peer, admin_token: str):
        self.sim, self.slurm, self.agents, self.prom, self.am = sim, slurm, agents, prom, am
        self.admin_token = admin_token

    def api(self, node: str, path: str) -> Any:
        status, body = self.agents[node].get(path, token=self.admin_token)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of a node as Slurm itself reports it."""
        out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"], capture_output=True, text=True,
                             env=self.slurm.env, timeout=10).stdout.strip()
        state, _, reason = out.partition("|")
        return state, reason

    def alerts(self, name: str) -> list[dict]:
        return self.prom.query(f'ALERTS{{alertname="{name}", alertstate="firing"}}')

    def diagnostics(self) -> str:
        logs = {n: a.log()[-2000:] for n, a in self.agents.items()}
        return (f"\nslurm: {self.slurm.states()}\nprometheus:\n{self.prom.log_tail(1500)}\n"
                f"alertmanager:\n{self.am.log_tail(1500)}\nagents:\n" + "\n".join(f"{k}: {v}" for k, v in logs.items()))


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    for b in PEER_BINARIES:
        require_binary(b)
    work = tmp_path_factory.mktemp("e2e")
    admin_token, webhook_token = "e2e-admin-token", "e2e-webhook-token"
    (work / "admin.token").write_text(admin_token + "\n")
    (work / "webhook.token").write_text(webhook_token + "\n")
    sim = SimThread(Simulator(nodes=len(NODES), gpus=4, workdir=work / "sim", advertise=False))
    sim.start()
    # node01 is an NVLink5 (GB200-class) node: the twin then serves the BER fields the dashboards plot;
    # node02 stays NVLink4 as in the stock demo rack.
    with sim.sim.model.lock:
        for g in sim.sim.model.nodes["node01"].gpus:
            g.nvlink_version = 7
    slurm = agents = None
    try:
        slurm = SlurmCluster(names=list(NODES), base=work / "slurm").start()
        agents = {}
        # the agents know each other (static coordination, as the demo rack's do): the trays' cooling summaries
        # then give each GPU its rack reference, and the cold-plate panels have data on this rack too
        ports = {node: free_port() for node in NODES}
        urls = {node: f"http://127.0.0.1:{port}" for node, port in ports.items()}
        for node in NODES:
            cfg = agent_config(sim.sim, node, ports[node], work, mode="enforce", slurm_conf=slurm.conf,
                               agent_urls=urls)
            # R gated, smoothed and learnt in seconds, so its baseline is a reference before the dashboards' test
            cfg["sources"]["thermal_resistance"] = {"interval": 1.0, "timeout": 1.0, "settle_seconds": 2.0,
                                                    "smoothing_seconds": 2.0, "baseline_learn_seconds": 4.0}
            if node == "node02":  # only the webhook path may drain node02 for an NVLink fault
                cfg["remediation"]["detectors"] = {"nvlink_errors": {"enabled": False}}
            (work / node).mkdir(exist_ok=True)
            agents[node] = AgentProcess(cfg, work / node).start()
        scrape = [{"job_name": "supernode-agent", "static_configs": [
            {"targets": [f"127.0.0.1:{a.port}"], "labels": {"rack": "r01", "node": n}} for n, a in agents.items()]}]
        rules = [accelerated_rules(REPO / "alerts" / f, work / f) for f in ("recording.rules.yml", "supernode.rules.yml")]
        am_cfg = agent_webhook_config(agents["node01"].url + "/api/v1/alerts", work / "webhook.token")
        with alertmanager_server(work / "am", am_cfg) as am, \
                prometheus_server(work / "prom", scrape, rule_files=rules, alertmanager_url=am.url) as prom:
            yield Stack(sim, slurm, agents, prom, am, admin_token)
    finally:
        for a in (agents or {}).values():
            a.stop()
        if slurm is not None:
            slurm.cleanup()
        sim.stop()


def test_a_quiet_rack_shows_zero_not_no_data_on_the_remediation_dashboard(stack):
    """First in the module: nothing has happened yet. Counters of known labels start at zero, so every panel
    of the remediation dashboard (actions, blocks, incidents, MTTR inputs, outcomes) has data."""
    s = stack
    wait_for(lambda: s.prom.query('supernode_remediation_actions_total{node="node01"}'), timeout=25, interval=0.2,
             what="remediation counters scraped")
    # nothing has happened to the rack: no incident of any detector (a leak source that missed its polls on a
    # starved machine is the agent's right answer to that machine, not to the rack, so it is not counted here)
    assert not [r for r in s.prom.query('supernode_incidents_total{rack="r01", detector!="leak_source_down"}')
                if float(r["value"][1]) != 0]
    queries = [(d, t, e) for d, t, e in panel_queries() if d == "remediation"]
    assert len(queries) >= 8
    empty = panels_without_data(s.prom, queries, timeout=15)
    assert empty == [], "remediation panels without data on a quiet rack:\n" + "\n".join(empty)


def test_nvlink_storm_drains_through_alertmanager_webhook_and_resumes(stack):
    s = stack
    wait_for(lambda: len(s.prom.query('up{job="supernode-agent"} == 1')) == 2
             and s.prom.query('node_gpu:supernode_gpu_nvlink_errors:rate5m{node="node02"}'),
             timeout=20, interval=0.2, what="both agents scraped and the NVLink recording rule evaluated")
    assert s.alerts(ALERT) == []
    assert s.node_state("node02")[0] == "idle"

    s.sim.post("/api/v1/inject", {"kind": "nvlink-errors", "params": {"node": "node02", "gpu": 0, "link": 3,
                                                                    "rate": 500}})
    firing = wait_for(lambda: s.alerts(ALERT), timeout=20, interval=0.2, what=f"{ALERT} firing in Prometheus")
    assert {(a["metric"]["node"], a["metric"]["gpu"], a["metric"]["link"]) for a in firing} == {("node02", "0", "3")}

    def drained() -> str | None:
        state, reason = s.node_state("node02")
        return reason if state in ("drained", "draining", "drained*") and reason.startswith(MARKER) else None
    try:
        reason = wait_for(drained, timeout=25, interval=0.2, what="node02 drained by the agent in Slurm")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{s.diagnostics()}") from None
    assert s.node_state("node01")[0] == "idle"

    # The incident came through the webhook: node01's agent, source alertmanager, acting on node02.
    inc = next(i for i in s.api("node01", "/api/v1/incidents")["open"] if i["detector"] == "nvlink_errors")
    assert inc["source"] == "alertmanager"
    assert inc["targets"] == {"node": "node02", "gpu": "0", "link": "3"}
    assert inc["playbook"] == "nvlink-errors"
    assert inc["id"] in reason
    # node02's own agent never saw an NVLink incident (its local detector is off).
    assert not [i for i in s.api("node02", "/api/v1/incidents")["open"] if i["detector"] == "nvlink_errors"]
    def incident_entries() -> list[dict]:
        return [e for e in s.api("node01", "/api/v1/journal")["entries"] if e["incident_id"] == inc["id"]]
    # Slurm shows the drain before the agent has read it back and written the result: wait for it.
    wait_for(lambda: [e["result"] for e in incident_entries() if e["kind"] == "result" and e["action"] == "drain"] == ["done"],
             timeout=15, interval=0.1, what="drain result journaled")
    mine = incident_entries()
    assert [e["target"] for e in mine if e["kind"] == "intent"] == ["node=node02"]
    hooks = s.agents["node01"].metrics()
    assert re.search(r'supernode_webhook_requests_total\{result="accepted"\} [1-9]', hooks), "no accepted webhook"

    # Clear the fault: the alert resolves, Alertmanager sends `resolved`. node01's agent cannot run the
    # NVML resume check on node02, so the resume waits for a person (resume_after_check), who approves.
    s.sim.post("/api/v1/clear")
    wait_for(lambda: not s.alerts(ALERT), timeout=30, interval=0.2, what=f"{ALERT} resolved in Prometheus")
    pending = wait_for(lambda: [p for p in s.api("node01", "/api/v1/incidents")["pending_approvals"]
                                if p["incident_id"] == inc["id"] and p["phase"] == "undo"],
                       timeout=20, interval=0.2, what="resume waiting for approval")
    assert pending[0]["approval"] == "resume_after_check" and s.node_state("node02")[0].startswith("drain")
    status, _ = s.agents["node01"].request("POST", f"/api/v1/incidents/{inc['id']}/approve", token=s.admin_token)
    assert status == 200
    try:
        wait_for(lambda: s.node_state("node02")[0] == "idle", timeout=20, interval=0.2, what="node02 resumed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{s.diagnostics()}") from None
    recent = {i["id"]: i for i in s.api("node01", "/api/v1/incidents")["recent"]}
    assert recent[inc["id"]]["state"] == "resolved"
    entries = s.api("node01", "/api/v1/journal")["entries"]
    assert [e["result"] for e in entries if e["incident_id"] == inc["id"] and e["kind"] == "result"
            and e["action"] == "drain"] == ["done", "undone"]


# --- every dashboard panel against the live stack ------------------------------------------------------

# Series that exist only once something happened: an action (notify not configured), a guardrail block
# (the gpu-reset playbook's drain on a node in maintenance), a resolved incident (the NVLink test above), an XID.
AFTER_FAULTS = ("supernode_remediation_actions_total", "supernode_remediation_blocked_total",
                "supernode_incident_duration_seconds_count", "supernode_gpu_xid_errors_total",
                "supernode_incident_open")


def concrete(expr: str) -> str:
    """Template variables as Grafana expands them for rack r01 and both nodes."""
    return (expr.replace("$__rate_interval", "5s").replace("$__interval", "1s").replace("$rack", "r01")
            .replace("$node", "node01|node02"))


def panels_without_data(prom, queries: list[tuple[str, str, str]], timeout: float) -> list[str]:
    """The panel queries still empty once every one answers or `timeout` passes (named, for the assertion)."""
    def missing() -> list[str]:
        return [f"{d}/{t}: {e}" for d, t, e in queries if not prom.query(concrete(e))]
    try:
        wait_for(lambda: not missing(), timeout=timeout, interval=0.5, what="every panel query answering")
    except AssertionError:
        pass  # the caller's assertion names the queries still empty
    return missing()


def panel_queries() -> list[tuple[str, str, str]]:
    out = []
    for name in build.DASHBOARDS:
        for p in json.loads(build.path_of(name).read_text())["panels"]:
            out += [(name, p["title"], t["expr"]) for t in p["targets"]]
    return out


def test_every_dashboard_query_has_data_from_the_simulated_rack(stack):
    s = stack
    # A reset-class XID (48) on node01 while a person has node01 in maintenance: the drain is blocked (a
    # guardrail block), notify is recorded as not configured (an action result), and the incident stays open
    # (it clears only on a proven reset).
    status, _ = s.agents["node01"].request("POST", "/api/v1/maintenance", body={"node": "node01", "on": True},
                                           token=s.admin_token)
    assert status == 200
    s.sim.post("/api/v1/inject", {"kind": "xid", "params": {"node": "node01", "gpu": 1, "code": 48}})
    try:
        wait_for(lambda: all(s.prom.query(f'{m}{{node="node01"}}') for m in AFTER_FAULTS),
                 timeout=25, interval=0.2, what="action, block, incident and XID series scraped")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{s.diagnostics()}") from None
    queries = panel_queries()
    assert len(queries) >= 60
    # Rates over 5 s need two samples after the XID; recording rules one evaluation after the scrape.
    empty = panels_without_data(s.prom, queries, timeout=10)
    assert empty == [], "dashboard queries without data on the simulated rack:\n" + "\n".join(empty)
    # The check bites: the same substitution on a metric nobody exports comes back empty.
    assert s.prom.query(concrete('supernode_no_such_metric{rack=~"$rack", node=~"$node"}')) == []
